"""scripts/repro/claims_epoch.py, issue 29's claims table: results/epoch/claims.toml names only methods
and lengths of the epoch plan, and on synthetic run folders (the committed kerple-s0 shifted) whose
truth is known the verdicts come out right (confirmed, contradicted, inconclusive, not tested), with
the intervals of lenx compare; a bad claims.toml gets a one-line error before anything is written."""

import json
from pathlib import Path
import shutil
import tomllib

import numpy as np
import pytest

from _compare import same_json, same_text
from lenx.config import load_config
from lenx.evaluation.evaluate import default_lengths
from lenx.report.compare import compare_runs
from test_repro_epoch import REPRO as ROOT_SCRIPTS, RESULTS, epoch_plan, fake_run, script, train_sets

CLAIMS = RESULTS / "claims.toml"


def plan_methods() -> dict[int, tuple[set, list]]:
    """train_len -> (the plan's method labels, the lengths lenx eval scores)."""
    out = {}
    for job in epoch_plan():
        cfg = load_config("125m", train_sets(job["cmd"])[0])
        T, m = cfg.train.seq_len, cfg.model
        name = m.method + (f" (D={m.dape_hidden})" if m.dape_hidden != 32 else "")
        labels, _ = out.setdefault(T, (set(), default_lengths(T, cfg.eval.max_length, cfg.eval.scored)))
        labels.add(name)
    return out


def test_every_claim_names_methods_and_lengths_of_the_epoch_plan():
    data = tomllib.loads(CLAIMS.read_text())
    plan = plan_methods()
    assert sorted(plan) == [128, 512, 2048] and plan[128][1] == [256, 512, 1024, 2048, 4096, 8192, 16384]
    for claim in data["claim"]:
        labels, lengths = plan[claim["train_len"]]
        assert claim["a"] in labels and claim.get("b", claim["a"]) in labels, claim["id"]
        spec = claim.get("lengths", [])
        assert spec == "every length >= 2T" or set(spec) <= set(lengths), claim["id"]
        assert claim.get("b_length", lengths[0]) in lengths, claim["id"]
    ids = {c["id"] for c in data["claim"]}
    # the claims the issue names, at every training length where the plan has their runs
    for T in ("T128", "T512"):
        assert {f"rope-fails-{T}", f"kerple-flat-{T}", f"dape-below-kerple-{T}", f"dapev2-below-dape-{T}",
                f"dapev2-below-kerple-in-{T}", f"dapev2-below-kerple-beyond-{T}", f"dp-dapev2-positive-{T}",
                f"dp-rope-negative-{T}", f"sb-competitive-in-{T}"} <= ids
    # both readings where a paper's claim is ambiguous (issue 44): Kerple flat (its own paper) and
    # degrading (DAPE V2's baseline); stick-breaking competitive in distribution and beyond
    for T in ("T128", "T512", "T2048"):
        assert {f"kerple-flat-{T}", f"kerple-degrades-{T}", f"sb-competitive-in-{T}"} <= ids
    assert {"sb-competitive-beyond-T128", "sb-competitive-beyond-T512", "sb-below-rope-T2048"} <= ids
    assert {"alibi-flat-T128", "capacity-D10-T128", "capacity-D21-T128", "sb-below-nope-T128", "rope-fails-T2048",
            "sb-2048-to-16384-T2048", "sb-competitive-in-T2048"} <= ids
    untested = {u["id"] for u in data["untested"]}
    assert {"kernel-size", "che", "leakage", "dapev2-nope-rope", "dapev2-alibi-fire"} <= untested
    assert all(u["report"] for u in data["untested"]) and not ids & untested


SUMMARY_BEGIN = "<!-- claims summary: made by scripts/repro/claims_epoch.py from results/epoch/claims.json -->"
SUMMARY_END = "<!-- end of the claims summary -->"


def test_the_committed_claims_table_is_up_to_date(tmp_path):
    """claims.md and claims.json are what the script makes of the committed runs and claims.toml, and
    REPORT.md carries their summary (a hand edit or a stale copy of it fails here). Numbers are compared
    to within rounding noise (tests/_compare.py: another numpy or CPU moves a bootstrap figure in its
    last digits), every word and verdict exactly."""
    here = tmp_path / "results" / "epoch"
    shutil.copytree(RESULTS, here)
    report_md = RESULTS.parent / "REPORT.md"
    text = report_md.read_text()  # the verdict2 summary has its own begin marker and the same end marker
    assert text.count(SUMMARY_BEGIN) == 1 and SUMMARY_END in text.split(SUMMARY_BEGIN)[1]
    shutil.copy(report_md, here.parent / "REPORT.md")
    out = script("claims_epoch.py", "--results", "results/epoch", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    made, committed = (json.loads((where / "claims.json").read_text()) for where in (here, RESULTS))
    assert same_json(made, committed) == []
    assert same_text((here / "claims.md").read_text(), (RESULTS / "claims.md").read_text()) == []
    assert same_text((here.parent / "REPORT.md").read_text(), report_md.read_text()) == []
    report = json.loads((RESULTS / "claims.json").read_text())
    kerple = {r["id"]: r for r in report["claims"]}["kerple-flat-T128"]
    one_seed = len(kerple["runs"]["kerple"]) == 1
    assert kerple["verdict"] != "not tested"
    assert kerple["covers"] == ("documents only" if one_seed else "seeds and documents")


TEST_CLAIMS = '''
[[claim]]
id = "holds"
paper = "p"
claim = "DAPE V2 below Kerple"
evidence = "e"
train_len = 128
metric = "ppl"
a = "dapev2-kerple"
b = "kerple"
direction = "below"
lengths = [8192, 16384]

[[claim]]
id = "contradicted"
paper = "p"
claim = "DAPE below Kerple"
evidence = "e"
train_len = 128
metric = "ppl"
a = "dape-kerple"
b = "kerple"
direction = "below"
lengths = "every length >= 2T"

[[claim]]
id = "inconclusive"
paper = "p"
claim = "stick-breaking below Kerple"
evidence = "e"
train_len = 128
metric = "ppl"
a = "stickbreaking"
b = "kerple"
direction = "below"
lengths = [16384]

[[claim]]
id = "missing"
paper = "p"
claim = "RoPE above Kerple"
evidence = "e"
train_len = 128
metric = "ppl"
a = "rope"
b = "kerple"
direction = "above"
lengths = [16384]

[[claim]]
id = "dp"
paper = "p"
claim = "DAPE V2's ΔP positive"
evidence = "e"
train_len = 128
metric = "delta_p"
a = "dapev2-kerple"
direction = "above"
lengths = "every length >= 2T"

[[claim]]
id = "in"
paper = "p"
claim = "DAPE V2 below Kerple in distribution"
evidence = "e"
train_len = 128
metric = "in_distribution"
a = "dapev2-kerple"
b = "kerple"
direction = "below"

[[claim]]
id = "flat"
paper = "p"
claim = "ALiBi flat"
evidence = "e"
train_len = 128
metric = "ppl"
a = "alibi"
b_length = 256
scale = "ratio"
threshold = 1.25
direction = "below"
lengths = [8192]

[[untested]]
id = "kernel"
paper = "p"
claim = "kernels"
evidence = "e"
why = "no runs"
report = "REPORT.md section 3"
'''


@pytest.fixture
def results(tmp_path):
    """results/epoch with runs whose truth is known: DAPE V2 0.3 nats below Kerple, DAPE 0.3 above,
    stick-breaking 0.001 above (within the noise), ALiBi one seed, no RoPE."""
    res = tmp_path / "results" / "epoch"
    runs = res / "runs" / "T128"
    for method, shift in (("kerple", 0.0), ("dapev2-kerple", -0.3), ("dape-kerple", 0.3), ("stickbreaking", 0.001)):
        for seed in (0, 1):
            fake_run(runs / f"{method}-s{seed}", method, seed, shift + 0.002 * seed)
    fake_run(runs / "alibi-s0", "alibi", 0, 0.05)
    (res / "claims.toml").write_text(TEST_CLAIMS)
    return tmp_path, res


def test_verdicts_on_runs_whose_truth_is_known(results):
    cwd, res = results
    out = script("claims_epoch.py", "--results", "results/epoch", "--resamples", "200", cwd=cwd)
    assert out.returncode == 0, out.stderr
    report = json.loads((res / "claims.json").read_text())
    by_id = {r["id"]: r for r in report["claims"]}
    assert {k: r["verdict"] for k, r in by_id.items()} == {
        "holds": "confirmed", "contradicted": "contradicted", "inconclusive": "inconclusive",
        "missing": "not tested", "dp": "confirmed", "in": "inconclusive", "flat": "confirmed"}
    assert "3 confirmed, 1 contradicted, 2 inconclusive, 1 not tested" in out.stdout
    assert by_id["missing"]["missing"] == ["runs/T128/rope-s0", "runs/T128/rope-s1", "runs/T128/rope-s2"]
    assert by_id["contradicted"]["figures"][0]["length"] == 256 and len(by_id["contradicted"]["figures"]) == 7
    inc = by_id["inconclusive"]["figures"][0]
    assert inc["lo"] < 0 < inc["hi"]
    assert by_id["holds"]["covers"] == "seeds and documents" and by_id["holds"]["runs"]["kerple"] == ["kerple-s0",
                                                                                                        "kerple-s1"]
    assert by_id["holds"]["planned"]["kerple"] == ["kerple-s0", "kerple-s1", "kerple-s2"]
    assert by_id["flat"]["covers"] == "documents only"
    # fake_run shifts only the scored windows, not the in-distribution term: no difference there
    assert abs(by_id["in"]["figures"][0]["value"]) < 1e-9

    # the figures are lenx compare's differences (the same bootstrap)
    folders = sorted((res / "runs" / "T128").glob("*-s*"))
    direct = compare_runs([f for f in folders if not f.name.startswith("alibi")], reference="kerple", n=200)
    for L, f in zip((8192, 16384), by_id["holds"]["figures"]):
        d = direct["differences"]["dapev2-kerple"][str(L)]
        assert f["length"] == L and np.allclose([f["value"], f["lo"], f["hi"]], [d["diff"], d["lo"], d["hi"]])
    dp = direct["methods"]["dapev2-kerple"]["lengths"]["8192"]["delta_p"]
    assert np.isclose(by_id["dp"]["figures"][5]["value"], dp["value"])

    table = (res / "claims.md").read_text()
    assert "| **holds**: DAPE V2 below Kerple |" in table and "**contradicted**" in table
    assert "missing: runs/T128/rope-s0, runs/T128/rope-s1, runs/T128/rope-s2" in table
    assert "**confirmed** (one seed: documents only)" in table and "Rule: confirmed: the 95% interval" in table
    assert "| **kernel**: kernels | p | e | no runs | REPORT.md section 3 |" in table
    assert "ppl(alibi) / ppl(alibi at 256) < 1.25 at 8192 (T 128)" in table
    # the one-line summary: a confirmed claim's weakest figure, the first figure on the wrong side or
    # across the boundary otherwise (with the other lengths where it is), what an untested one waits for
    weakest = max(by_id["holds"]["figures"], key=lambda f: f["hi"])
    assert f"weakest, at {weakest['length']}: {weakest['value']:+.2f} [" in table
    wrong = [f["length"] for f in by_id["contradicted"]["figures"] if f["verdict"] == "contradicted"]
    assert f"at {wrong[0]}: " in table and f"(contradicted also at {', '.join(map(str, wrong[1:]))})" in table
    assert "| waits for 3 runs at T 128 | **not tested** |" in table
    assert "| **confirmed** (one seed) |" in table


def test_the_summary_goes_into_a_report_with_markers(results):
    cwd, res = results
    report_md = res.parent / "REPORT.md"
    report_md.write_text(f"# R\n\nbefore\n{SUMMARY_BEGIN}\nold table\n{SUMMARY_END}\nafter\n")
    out = script("claims_epoch.py", "--results", "results/epoch", "--resamples", "200", cwd=cwd)
    assert out.returncode == 0, out.stderr
    assert "updated the claims summary in results/REPORT.md" in out.stdout
    text = report_md.read_text()
    assert "old table" not in text and text.startswith("# R\n\nbefore\n") and text.endswith("after\n")
    assert "| **holds**: DAPE V2 below Kerple |" in text
    report_md.write_text("# R\n\nno markers\n")
    out = script("claims_epoch.py", "--results", "results/epoch", "--resamples", "200", cwd=cwd)
    assert out.returncode == 0 and "updated the claims summary" not in out.stdout
    assert report_md.read_text() == "# R\n\nno markers\n"


BAD = [
    ("a = \"dapev2-kerple\"\nb = \"kerple\"", "a = \"dapev2-kerple\"\nb = \"cope\"",
     "claim 'holds': b = 'cope' is not a method of the epoch plan at T 128"),
    ("lengths = [8192, 16384]", "lengths = [8192, 9000]", "claim 'holds': length 9000 is not evaluated at T 128"),
    ("direction = \"below\"\nlengths = [8192, 16384]", "direction = \"lower\"\nlengths = [8192, 16384]",
     "claim 'holds': direction must be below or above, got 'lower'"),
    ("id = \"contradicted\"", "id = \"holds\"", "claim 'holds': id used twice"),
    ("metric = \"delta_p\"", "metric = \"loss\"", "claim 'dp': metric must be one of ppl, in_distribution, delta_p"),
    ("threshold = 1.25", "threshold = 1.25\nthreshhold = 2", "claim 'flat': unknown key threshhold"),
    ("train_len = 128\nmetric = \"in_distribution\"", "train_len = 1024\nmetric = \"in_distribution\"",
     "claim 'in': train_len must be one of the epoch plan's 128, 512, 2048, got 1024"),
    ("lengths = \"every length >= 2T\"\n\n[[claim]]\nid = \"inconclusive\"",
     "lengths = \"all\"\n\n[[claim]]\nid = \"inconclusive\"", "lengths must be a list of lengths or"),
    ("evidence = \"e\"\ntrain_len = 128\nmetric = \"ppl\"\na = \"rope\"", "train_len = 128\nmetric = \"ppl\"\na = \"rope\"",
     "claim 'missing': missing evidence"),
    ("[[claim]]\nid = \"holds\"", "[other]\nk = 1\n\n[[claim]]\nid = \"holds\"", "unknown table other"),
    ("[[claim]]\nid = \"holds\"", "[claim\nid = \"holds\"", "not readable TOML"),
]


@pytest.mark.parametrize("old, new, message", BAD, ids=[m.split(":")[-1][:30] for _, _, m in BAD])
def test_a_bad_claims_file_gets_one_line_before_any_work(results, old, new, message):
    cwd, res = results
    assert old in TEST_CLAIMS
    (res / "claims.toml").write_text(TEST_CLAIMS.replace(old, new, 1))
    before = {p: p.read_bytes() for p in res.rglob("*") if p.is_file()}
    out = script("claims_epoch.py", "--results", "results/epoch", cwd=cwd)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: results/epoch/claims.toml: ")
    assert message in lines[0], lines
    assert {p: p.read_bytes() for p in res.rglob("*") if p.is_file()} == before


def test_collect_epoch_checks_the_claims_before_it_writes(results):
    """The collector runs the claims at its end, so it checks claims.toml first: a bad one leaves the
    tree as it was; a good one gives claims.md beside the tables."""
    cwd, res = results
    (res / "claims.toml").write_text(TEST_CLAIMS.replace('direction = "above"', 'direction = "up"', 1))
    before = {p: p.read_bytes() for p in res.rglob("*") if p.is_file()}
    out = script("collect_epoch.py", "results/epoch", "--resamples", "200", cwd=cwd)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and lines == ["error: results/epoch/claims.toml: claim 'missing': direction must be "
                                             "below or above, got 'up'"]
    assert {p: p.read_bytes() for p in res.rglob("*") if p.is_file()} == before
    (res / "claims.toml").write_text(TEST_CLAIMS)
    out = script("collect_epoch.py", "results/epoch", "--resamples", "200", cwd=cwd)
    assert out.returncode == 0, out.stderr
    assert "wrote results/epoch/claims.md (3 confirmed, 1 contradicted, 2 inconclusive, 1 not tested)" in out.stdout
    assert (res / "T128" / "tables.md").is_file() and (res / "claims.json").is_file()


def test_claims_cli_options(results, tmp_path):
    cwd, res = results
    for args, message in [(("--results", "nowhere"), "--results nowhere is not a folder"),
                          (("--results", "results/epoch", "--resamples", "5"), "--resamples must be at least 100"),
                          (("--results", "results/epoch", "--claims", "none.toml"), "none.toml: no such file")]:
        out = script("claims_epoch.py", *args, cwd=cwd)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and message in lines[0], lines
    help_out = script("claims_epoch.py", "--help", cwd=cwd)
    assert help_out.returncode == 0 and "--claims" in help_out.stdout and "claims.md" in help_out.stdout


CROSS = '''
[[claim]]
id = "same-tokens"
paper = "p"
claim = "DAPE V2 at 128 matches RoPE at 2048"
evidence = "e"
train_len = 128
metric = "ppl"
a = "dapev2-kerple"
b = "rope"
b_train_len = 2048
scale = "ratio"
threshold = 1.02
direction = "below"
lengths = [2048, 16384]
'''


def test_a_claim_across_training_lengths(results):
    """b_train_len pairs a run trained at 128 with one trained at 2048 on the same scored windows: the
    figure is method_difference's ratio of the two (independent models, so not the same seeds'
    difference); a bad b_train_len is a one-line error."""
    from lenx.report.stats import method_difference

    cwd, res = results
    (res / "claims.toml").write_text(CROSS)
    out = script("claims_epoch.py", "--results", "results/epoch", "--resamples", "200", cwd=cwd)
    assert out.returncode == 0, out.stderr
    first = json.loads((res / "claims.json").read_text())["claims"][0]
    assert first["verdict"] == "not tested" and first["missing"] == ["runs/T2048/rope-s0"]
    rope = fake_run(res / "runs" / "T2048" / "rope-s0", "rope", 0, 0.2, seq_len=2048)
    out = script("claims_epoch.py", "--results", "results/epoch", "--resamples", "200", cwd=cwd)
    assert out.returncode == 0, out.stderr
    r = json.loads((res / "claims.json").read_text())["claims"][0]
    assert r["verdict"] == "confirmed" and r["covers"] == "documents only"  # RoPE has one seed
    assert r["runs"] == {"dapev2-kerple": ["dapev2-kerple-s0", "dapev2-kerple-s1"], "rope at T 2048": ["rope-s0"]}
    a = [json.loads((res / "runs" / "T128" / f"dapev2-kerple-s{s}" / "eval.json").read_text()) for s in (0, 1)]
    b = json.loads((rope / "eval.json").read_text())
    for f in r["figures"]:
        L = str(f["length"])
        d = method_difference(np.stack([e["results"][L]["window_nll"] for e in a]), b["results"][L]["window_nll"],
                              b["window_documents"], n=200, scale="nll")
        assert np.allclose([f["value"], f["lo"], f["hi"]], np.exp([d["diff"], d["lo"], d["hi"]]))
    assert "ppl(dapev2-kerple) / ppl(rope trained at 2048) < 1.02 at 2048, 16384 (T 128)" in (res / "claims.md").read_text()
    for old, new, message in [("b_train_len = 2048", "b_train_len = 1024", "b_train_len must be one of the epoch plan's"),
                              ("lengths = [2048, 16384]", "lengths = [1024, 2048]", "length 1024 is not evaluated at T 2048"),
                              ("b = \"rope\"", "b = \"dapev2-kerple\"", "b = 'dapev2-kerple' is not a method of the epoch "
                                                                     "plan at T 2048")]:
        (res / "claims.toml").write_text(CROSS.replace(old, new))
        bad = script("claims_epoch.py", "--results", "results/epoch", cwd=cwd)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr


def test_a_verdict_that_changes_with_the_bootstrap_seed_is_recomputed_or_called_inconclusive():
    """scripts/repro/stability.py: a verdict all bootstrap seeds agree on stands at the given resamples;
    one they disagree on is computed with ten times the resamples, and stands only if they agree there."""
    import sys
    sys.path.insert(0, str(ROOT_SCRIPTS))
    from stability import SEEDS, stable, stability_text

    calls = []

    def measure(n, seed, flaky_until=None):
        calls.append((n, seed))
        flaky = flaky_until is None or n < flaky_until
        return [{"n": n}], "inconclusive" if flaky and seed % 3 == 1 else "confirmed"

    figures, verdict, check = stable(lambda n, s: measure(n, s, flaky_until=0), 2000)
    assert verdict == "confirmed" and check["resamples"] == 2000 and check["verdicts"] == {"confirmed": SEEDS}
    assert len(calls) == SEEDS and stability_text(check) == ""
    figures, verdict, check = stable(lambda n, s: measure(n, s, flaky_until=20000), 2000)
    assert verdict == "confirmed" and figures == [{"n": 20000}] and check["raised"] and not check["borderline"]
    assert stability_text(check) == f"the same for {SEEDS} of {SEEDS} bootstrap seeds at 20000 resamples"
    figures, verdict, check = stable(measure, 2000)
    assert verdict == "inconclusive" and check["borderline"] and check["verdicts"] == {"confirmed": 13, "inconclusive": 7}
    assert stability_text(check) == ("borderline: confirmed for 13 of 20 bootstrap seeds, inconclusive for 7, "
                                     "at 20000 resamples")


def test_every_committed_verdict_records_its_stability():
    report = json.loads((RESULTS / "claims.json").read_text())
    tested = [r for r in report["claims"] if r["verdict"] != "not tested"]
    assert tested and all(r["stability"]["seeds"] >= 20 for r in tested)
    for r in tested:
        agree = r["stability"]["verdicts"].get(r["verdict"], 0)
        assert agree == r["stability"]["seeds"] or (r["stability"]["borderline"] and r["verdict"] == "inconclusive"), r["id"]
