"""scripts/repro/collect_verdict2.py, as a user runs it (a subprocess, relative paths, another working
directory): a fabricated device tree of the verdict2 plan (T 512 and T 2048) -> results/verdict2 with
every finished run's files, done.txt for the next machine, the scheduler's files, `lenx compare` at
each length with the recipe runs the plan reuses (copies of the committed ones under results/recipe)
and the claims with REPORT.md's verdict2 summary (a copy of the real REPORT.md); unfinished runs named
and left out; a second collect adds to the first; bad input is one line before anything is written."""

import json
from pathlib import Path
import shutil

import numpy as np
import pytest

from lenx.evaluation.positions import per_position

from test_repro_claims_verdict2 import CLAIMS, fabricate, planned_sets, verdict2_methods
from test_repro_epoch import REPRO, script

ROOT = REPRO.parents[1]
REPORT = ROOT / "results" / "REPORT.md"
RECIPE = ROOT / "results" / "recipe" / "runs"  # the runs plan.py VERDICT_REUSED maps verdict2 runs to
SUITE_RUNS = {512: RECIPE / "T512" / "kerple-warm10-s0", 2048: RECIPE / "T2048" / "rope-warm10-s0"}  # real suite files
SUITE = ("eval_ruler.json", "eval_babilong.json")
KEPT = ("config.toml", "meta.json", "metrics.jsonl", "eval.json", "command.txt", "job.log", *SUITE)
BEGIN = "<!-- claims summary: made by scripts/repro/claims_epoch.py from results/verdict2/claims.json -->"
END = "<!-- end of the claims summary -->"
PLACEHOLDER = "Newer methods at T 512 (issue 44 part 4): not run yet."
SHIFTS = {"fox": -0.3, "pope": 0.3}


def device_run(tree: Path, name: str, seed: int, suite: tuple = SUITE, T: int = 512, **kw) -> Path:
    method, sets = planned_sets(verdict2_methods()[name])  # the same settings at 512 and 2048
    folder = fabricate(tree / f"T{T}" / f"{name}-s{seed}", method, seed, SHIFTS.get(name, 0.01) + 0.002 * seed, sets,
                       seq_len=T)
    if kw.get("steps_done"):  # cut off: its metrics stop early
        metrics = (folder / "metrics.jsonl").read_text().splitlines()
        (folder / "metrics.jsonl").write_text("\n".join(m for m in metrics if json.loads(m)["step"] <= kw["steps_done"]))
    for f in suite:
        shutil.copy(SUITE_RUNS[T] / f, folder / f)
    result = json.loads((folder / "eval.json").read_text())  # the per-position loss, as eval.per_position writes it
    nll = np.random.default_rng(seed).normal(2.0 + SHIFTS.get(name, 0.0), 0.1, (len(result["window_documents"]), 16384))
    (folder / "eval.json").write_text(json.dumps(result | {"per_position": per_position(nll)}))
    return folder


def device_tree(tree: Path, ids: list[str]) -> None:
    tree.mkdir(parents=True, exist_ok=True)
    (tree / "plan.json").write_text(json.dumps([{"id": i} for i in ids]))
    (tree / "status.json").write_text(json.dumps({"jobs": [{"id": i, "state": "done"} for i in ids]}))
    (tree / "scheduler.log").write_text("[jobs] done\n")
    (tree / "machine.txt").write_text("NVIDIA H200\n")


@pytest.fixture
def here(tmp_path):
    """here/results: REPORT.md (the real one), verdict2/claims.toml, recipe/runs with the committed
    T512/kerple-warm10-s0 and T2048/rope-warm10-s0 (verdict2's kerple-s0 at 512, rope-s0 at 2048);
    here/back/runs/verdict2: seed 0 of every verdict2 run at T 512 the device runs (all but Kerple's)
    finished with its suite files, Kerple's and stick-breaking's seed 0 at T 2048, fox-s1 never
    evaluated, pope-s1 without its BABILong file, and a folder the plan does not hold."""
    res = tmp_path / "results"
    res.mkdir()
    shutil.copy(REPORT, res / "REPORT.md")
    (res / "verdict2").mkdir()
    shutil.copy(CLAIMS, res / "verdict2" / "claims.toml")
    for run in ("T512/kerple-warm10-s0", "T2048/rope-warm10-s0"):
        shutil.copytree(RECIPE / run, res / "recipe" / "runs" / run)
    tree = tmp_path / "back" / "runs" / "verdict2"
    device_run(tree, "fox", 0).rename(tree / "T512" / "extra-s0")
    for name in verdict2_methods():
        if name != "kerple":
            device_run(tree, name, 0)
    for name in ("kerple", "stickbreaking"):
        device_run(tree, name, 0, T=2048)
    fabricate(tree / "T512" / "fox-s1", "fox", 1, -0.3)
    (tree / "T512" / "fox-s1" / "eval.json").unlink()
    device_run(tree, "pope", 1, suite=SUITE[:1])
    device_tree(tree, [f"verdict2/T512/{n}-s0" for n in verdict2_methods() if n != "kerple"])
    return tmp_path


def collect(cwd: Path, *args: str):
    return script("collect_verdict2.py", *args, "--resamples", "100", cwd=cwd)


def files(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_collect_copies_finished_runs_writes_done_and_fills_the_claims(here):
    out = collect(here, "back/runs/verdict2", "--session", "session27")
    assert out.returncode == 0, out.stderr
    res, tree = here / "results" / "verdict2", here / "back" / "runs" / "verdict2"
    names = [f"T512/{n}-s0" for n in verdict2_methods() if n != "kerple"] + ["T2048/kerple-s0", "T2048/stickbreaking-s0"]
    assert sorted(f"{p.parent.name}/{p.name}" for p in (res / "runs").glob("*/*")) == sorted(names)  # no .part / .old
    for name in names:
        assert sorted(p.name for p in (res / "runs" / name).iterdir()) == sorted(KEPT)
        for f in KEPT:
            assert (res / "runs" / name / f).read_bytes() == (tree / name / f).read_bytes()
    assert (res / "done.txt").read_text().split() == [f"verdict2/{n}" for n in names]  # plan order
    assert "not finished (not trained and evaluated to the end), left out: back/runs/verdict2/T512/fox-s1" in out.stdout
    assert "not finished (no readable eval_babilong.json), left out: back/runs/verdict2/T512/pope-s1" in out.stdout
    assert "not in plan.py's verdict2 plan, left out: back/runs/verdict2/T512/extra-s0" in out.stdout
    assert "(15 of 52 planned runs done)" in out.stdout
    assert sorted(p.name for p in (res / "device" / "session27").iterdir()) == [
        "machine.txt", "plan.json", "scheduler.log", "status.json"]

    # compare: the verdict2 runs by run name, the reused recipe run among them (not the epoch five),
    # against Kerple and against RoPE, at 512 and at 2048
    compared = json.loads((res / "compare.json").read_text())
    assert set(compared) == {"kerple", "rope"}
    rope = compared["rope"]
    assert set(rope["methods"]) == set(verdict2_methods())
    assert rope["methods"]["rnope-swa"]["runs"] == ["runs/T512/rnope-swa-s0"]
    assert rope["methods"]["rope"]["runs"] == ["runs/T512/rope-s0"]
    assert rope["methods"]["kerple"]["runs"] == ["../recipe/runs/T512/kerple-warm10-s0"]
    at2048 = json.loads((res / "compare_T2048.json").read_text())
    assert set(at2048) == {"kerple", "rope"} and set(at2048["rope"]["methods"]) == {"kerple", "rope", "stickbreaking"}
    assert at2048["rope"]["methods"]["rope"]["runs"] == ["../recipe/runs/T2048/rope-warm10-s0"]
    assert at2048["rope"]["methods"]["kerple"]["runs"] == ["runs/T2048/kerple-s0"]
    assert "# The verdict2 runs at T 2048" in (res / "compare_T2048.md").read_text()
    assert (res / "compare_T2048_per_position.png").stat().st_size > 0
    assert rope["differences"]["fox"]["16384"]["diff"] < 0 < rope["differences"]["pope"]["16384"]["diff"]
    assert "## Every method against kerple" in (res / "compare.md").read_text()
    assert "fox" in compared["kerple"]["per_position"] and (res / "compare_per_position.png").stat().st_size > 0
    assert "eval_ruler.json: effective length per task" in (res / "compare.md").read_text()

    # the claims, and their summary in REPORT.md between the verdict2 markers only
    claims = json.loads((res / "claims.json").read_text())
    by_id = {r["id"]: r for r in claims["claims"]}
    assert by_id["fox-below-rope-beyond"]["verdict"] == "confirmed"
    assert by_id["fox-below-rope-beyond"]["runs"]["fox"] == ["fox-s0"]
    text, before = (here / "results" / "REPORT.md").read_text(), REPORT.read_text()
    assert PLACEHOLDER not in text and "| **fox-below-rope-beyond**: FoX outperforms" in text
    assert text.split(BEGIN)[0] == before.split(BEGIN)[0]
    assert text.split(BEGIN)[1].split(END, 1)[1] == before.split(BEGIN)[1].split(END, 1)[1]
    assert "wrote results/verdict2/claims.md (" in out.stdout


def test_a_second_collect_adds_to_the_first(here):
    assert collect(here, "back/runs/verdict2", "--session", "session27").returncode == 0
    res = here / "results" / "verdict2"
    first = files(res / "runs" / "T512" / "fox-s0")
    later = here / "later" / "runs" / "verdict2"
    device_run(later, "fox", 1)
    device_run(later, "fox", 0, steps_done=1000)  # a re-run cut off: the first copy stays
    device_tree(later, ["verdict2/T512/fox-s1", "verdict2/T512/fox-s0"])
    out = collect(here, "later/runs/verdict2", "--session", "session28")
    assert out.returncode == 0, out.stderr
    assert files(res / "runs" / "T512" / "fox-s0") == first
    assert "left out: later/runs/verdict2/T512/fox-s0" in out.stdout
    done = (res / "done.txt").read_text().split()
    assert len(done) == 16 and done[-1] == "verdict2/T512/fox-s1"
    assert (res / "device" / "session27" / "status.json").is_file() and (res / "device" / "session28").is_dir()
    claims = {r["id"]: r for r in json.loads((res / "claims.json").read_text())["claims"]}
    assert claims["fox-below-rope-beyond"]["runs"]["fox"] == ["fox-s0", "fox-s1"]


def test_bad_input_is_one_line_before_anything_is_written(here):
    res = here / "results"
    (here / "other").mkdir()
    (here / "other" / "T512").mkdir()
    (here / "other" / "plan.json").write_text(json.dumps([{"id": "epoch/T512/kerple-s0"}]))
    wrong = here / "back" / "runs" / "verdict2" / "T512" / "rnope-swa-s0"
    cases = [(("nowhere", "--session", "s"), "error: not a folder: nowhere"),
             (("back", "--session", "s"), "(did you mean back/runs/verdict2?)"),
             (("other", "--session", "s"), "other is the device tree of another plan (its plan.json lists epoch/"),
             (("back/runs/verdict2", "--session", "../x"), "--session takes a plain folder name, got ../x"),
             (("back/runs/verdict2", "--session", "s", "--baselines", "nowhere"),
              "--baselines nowhere is not a folder (the recipe results tree)"),
             (("back/runs/verdict2", "--session", "s", "--out", "back/runs"), "is inside --out back/runs")]
    before = files(res)
    for args, message in cases:
        out = collect(here, *args)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    out = script("collect_verdict2.py", "back/runs/verdict2", "--session", "s", "--resamples", "5", cwd=here)
    assert out.returncode == 2 and out.stderr.strip() == "error: --resamples must be at least 100, got 5"
    (res / "verdict2" / "claims.toml").write_text("[[claim]]\nid = 1\n")
    out = collect(here, "back/runs/verdict2", "--session", "s")
    assert out.returncode == 2 and out.stderr.strip().startswith("error: results/verdict2/claims.toml: ")
    shutil.copy(CLAIMS, res / "verdict2" / "claims.toml")
    shutil.rmtree(wrong)
    fabricate(wrong, "rope", 0, 0.0)  # plain RoPE where the RNoPE-SWA layout belongs
    for f in SUITE:
        shutil.copy(SUITE_RUNS[512] / f, wrong / f)
    out = collect(here, "back/runs/verdict2", "--session", "s")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "rnope-swa-s0 is not the planned rnope-swa-s0: its config has model.layers = ''" in lines[0]
    assert files(res) == before
    help_out = script("collect_verdict2.py", "--help", cwd=here)
    assert help_out.returncode == 0 and "--session" in help_out.stdout and "done.txt" in help_out.stdout


def test_report_md_has_the_verdict2_summary_markers_after_the_epoch_ones():
    text = REPORT.read_text()
    epoch = BEGIN.replace("verdict2", "epoch")
    assert text.count(BEGIN) == 1 and text.count(epoch) == 1 and text.index(epoch) < text.index(BEGIN)
    inside = text.split(BEGIN)[1].split(END)[0]
    assert inside.strip() == PLACEHOLDER or inside.strip().startswith("each claim in one line")  # or filled
