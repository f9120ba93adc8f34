"""scripts/repro/coverage.py: the simulated coverage of the claims' intervals that REPORT.md and
lenx.report.stats state (one statement, one file: results/epoch/coverage.json)."""

import json

from test_repro_epoch import RESULTS, script


def test_coverage_is_measured_in_every_setting_and_written(tmp_path):
    out = script("coverage.py", "--experiments", "20", "--out", "cov.json", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("wrote cov.json: coverage "), out.stderr
    made = json.loads((tmp_path / "cov.json").read_text())
    assert [(r["seeds"], r["seed_to_document_ratio"]) for r in made["rows"]] == [(s, r) for s in (2, 3)
                                                                                for r in (0, 0.5, 1, 2, 4, 8)]
    assert all(0 <= r["coverage"] <= 1 for r in made["rows"]) and made["experiments"] == 20
    for args, message in ((("--experiments", "5"), "--experiments must be at least 10"),
                          (("--out", "no/such/cov.json"), "no folder no/such")):
        bad = script("coverage.py", *args, cwd=tmp_path)
        assert bad.returncode == 2 and bad.stderr.startswith("error: ") and message in bad.stderr, bad.stderr


def test_the_committed_coverage_is_the_one_the_report_states():
    made = json.loads((RESULTS / "coverage.json").read_text())
    assert made["experiments"] == 1000 and len(made["rows"]) == 12
    stated = f"{made['min']:.1%}-{made['max']:.1%}".replace("%-", "-")
    report = (RESULTS.parent / "REPORT.md").read_text()
    assert stated in report and stated in (RESULTS / "claims.md").read_text(), stated
