"""Issue 42's SSMax initialisation check: the plan (scripts/repro/plan.py ssmax_init) and the script
that reads a trained run's learned scales (scripts/repro/ssmax_scales.py)."""

import json
import subprocess
import sys

from test_nothing_lost import REPO, SRC, WORDS, lenx, ok, write_jsonl
from test_repro_epoch import script

TINY = ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "train.seq_len=32", "train.batch_size=4",
        "train.steps=2", "train.device=cpu", "data.corpus='mydata'", "eval.windows=2", "eval.max_length=64"]


def test_the_plan_runs_init_043_on_three_seeds_and_1_on_seed_0():
    out = script("plan.py", "ssmax_init")
    assert out.returncode == 0, out.stderr
    jobs = json.loads(out.stdout)
    assert [j["id"] for j in jobs] == ["T128/ssmax-rope-init043-s0", "T128/ssmax-rope-init043-s1",
                                       "T128/ssmax-rope-init043-s2", "T128/ssmax-rope-init100-s0"]
    for j in jobs:
        init = "0.43" if "init043" in j["id"] else "1.0"
        assert f"model.temp_ssmax_init={init} " in j["cmd"] and "model.method=ssmax-rope" in j["cmd"]
        assert j["cmd"].endswith(f"python3 scripts/repro/ssmax_scales.py {j['run']}")


def scales(*runs, cwd):
    env = {"PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, str(REPO / "scripts/repro/ssmax_scales.py"), *runs], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env={**__import__("os").environ, **env})


def test_the_scales_of_a_trained_run_one_line_per_run(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", WORDS["a"], 0)
    ok(lenx("prepare", "mydata", "--from", "a.jsonl", "--vocab-size", "300", cwd=tmp_path))
    sets = [a for s in TINY for a in ("--set", s)]
    ok(lenx("train", "-c", "tiny", *sets, "--set", "model.method=ssmax-rope", "--set", "model.temp_ssmax_init=0.43",
            "-o", "runs/s", "--no-progress", cwd=tmp_path))
    ok(lenx("train", "-c", "tiny", *sets, "--set", "model.method=rope", "-o", "runs/r", "--no-progress", cwd=tmp_path))
    out = scales("runs/s", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)
    assert row["init"] == 0.43 and len(row["s"]) == 2 and all(len(layer) == 2 for layer in row["s"])
    # two AdamW steps at the tiny preset's lr move s_h off its start, but not far
    assert all(abs(x - 0.43) < 0.1 for layer in row["s"] for x in layer)
    for args, needle in ((["runs/r"], "has no SSMax scales"), (["runs/s", "runs/none"], "is not a run folder"),
                         ([], "usage")):
        out = scales(*args, cwd=tmp_path)
        lines = out.stderr.splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], out.stderr
        assert out.stdout == ""  # nothing printed for the good run before the bad one
