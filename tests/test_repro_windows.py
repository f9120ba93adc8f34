"""scripts/repro/windows_epoch.py: the test windows of the single-epoch tables, the same for every
run, with the domain mix of the pool they are drawn from (issue 44); the committed windows.md is what
the script makes of the committed runs."""

import json
import shutil

from _compare import same_json, same_text
from test_repro_epoch import RESULTS, fake_run, script


def test_the_committed_windows_breakdown_is_up_to_date(tmp_path):
    here = tmp_path / "results" / "epoch"
    for ev in RESULTS.glob("runs/T*/*/eval.json"):
        (here / ev.parent.relative_to(RESULTS)).mkdir(parents=True)
        shutil.copy(ev, here / ev.relative_to(RESULTS))
    out = script("windows_epoch.py", "--results", "results/epoch", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "wrote results/epoch/windows.md\n", out.stderr
    made = json.loads((here / "windows.json").read_text())
    assert same_json(made, json.loads((RESULTS / "windows.json").read_text())) == []
    assert same_text((here / "windows.md").read_text(), (RESULTS / "windows.md").read_text()) == []
    assert made["runs"] == 37 and made["tables"] == ["T128", "T512", "T2048"] and made["documents"] == 64
    kernel = made["pool"]["kernel files"]
    assert kernel["pool"] == 461 and kernel["range_95"][0] < kernel["expected"] < kernel["range_95"][1]
    assert sum(d["pool"] for d in made["pool"].values()) == 527
    assert "not recoverable from the committed files" in (here / "windows.md").read_text()


def test_runs_on_other_windows_are_refused(tmp_path):
    runs = tmp_path / "results" / "epoch" / "runs"
    fake_run(runs / "T128" / "kerple-s0", "kerple", 0, 0.0)
    other = fake_run(runs / "T128" / "rope-s0", "rope", 0, 0.1) / "eval.json"
    result = json.loads(other.read_text())
    other.write_text(json.dumps(result | {"window_documents": result["window_documents"][::-1]}))
    out = script("windows_epoch.py", "--results", "results/epoch", cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and lines == ["error: the runs score 2 different sets of windows; each table needs its "
                                             "own breakdown"], lines
    assert not (tmp_path / "results" / "epoch" / "windows.md").exists()
    bad = script("windows_epoch.py", "--results", "nowhere", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr == "error: --results nowhere has no runs folder\n"
