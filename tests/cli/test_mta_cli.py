"""MTA through the CLI as a user runs it (another working directory, relative paths): `lenx list`
names it with its paper, `lenx train` trains it, and bad MTA settings are one `error:` line (exit
2) before any work, writing nothing."""

import os
from pathlib import Path
import subprocess
import sys

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def lenx(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


def test_list_names_mta_with_its_paper(tmp_path):
    out = lenx("list", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = out.stdout.split("│ mta ")[1].split("│ mta-")[0]
    assert "2504.00927" in rows and "Golovneva" in rows and "released" in rows  # `mta` is the released form


def test_train_runs_mta(tmp_path):
    out = lenx("train", "-c", "tiny", "--set", "model.method=mta-kerple", "--set", "train.steps=2", "-o", "run",
               "--no-progress", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "run" / "config.toml").is_file()


@pytest.mark.parametrize("setting,words", [
    ("model.mta_key_kernel=10", "model.mta_key_kernel must be an odd integer"),
    ("model.mta_head_group=3", "model.mta_head_group must be 0 (all heads) or a divisor of model.n_head (4)"),
    ("model.method=mta-stickbreaking", "mixes the heads' softmax probabilities"),
    ("model.mta_post_key_kernel=4", "model.mta_post_key_kernel must be an odd integer"),
    ("model.mta_post_query_kernel=0", "model.mta_post_query_kernel must be >= 1"),
])
def test_bad_mta_settings_are_one_line(tmp_path, setting, words):
    out = lenx("train", "-c", "tiny", "--set", "model.method=mta", "--set", setting, "-o", "run", "--no-progress",
               cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], out.stderr
    assert not (tmp_path / "run").exists()

