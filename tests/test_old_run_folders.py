"""Run folders written by an earlier lenx still resume, evaluate and compare.

tests/fixtures/runs/ holds two tiny runs (rope, kerple; one layer, 2 steps, synthetic corpus) trained
at d155006, before issue 31 regrouped the package. They are driven through the CLI the way a user
would, from another working directory with relative paths, so the test holds whatever the modules
are called inside."""

import json
import os
from pathlib import Path
import re
import shutil
import subprocess
import sys

import lenx

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "runs"
SRC = str(Path(lenx.__file__).resolve().parents[1])


def lenx_cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, cwd=cwd, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def set_key(config: Path, key: str, value: str):
    """Edit one key of a run's config.toml, as a user moving or extending a run would."""
    text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", config.read_text(), count=1, flags=re.M)
    assert n == 1, key
    config.write_text(text)


def test_runs_written_before_the_regrouping_resume_evaluate_and_compare(tmp_path):
    work = tmp_path / "work"
    shutil.copytree(FIXTURES, work / "runs")
    for run in ("rope", "kerple"):  # the corpus root was an absolute path on the machine that trained them
        set_key(work / "runs" / run / "config.toml", "root", json.dumps(str(work / "data")))

    for run in ("rope", "kerple"):
        lenx_cli("eval", f"runs/{run}", cwd=work)
        result = json.loads((work / "runs" / run / "eval.json").read_text())
        assert result["step"] == 2 and result["method"] == run and result["results"], sorted(result)

    lenx_cli("compare", "runs/rope", "runs/kerple", "-o", "compare.json", cwd=work)
    compared = json.loads((work / "compare.json").read_text())
    assert set(compared["methods"]) == {"rope", "kerple"}
    assert compared["methods"]["kerple"]["lengths"]["64"]["ppl"] > 0

    set_key(work / "runs" / "rope" / "config.toml", "steps", "4")
    summary = json.loads(lenx_cli("train", "--resume", "runs/rope", cwd=work).stdout.strip().splitlines()[-1])
    assert summary["step"] == 4 and summary["finished"]
    steps = [json.loads(line)["step"] for line in (work / "runs" / "rope" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
