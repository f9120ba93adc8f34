"""`lenx --version`, usage lines in the usual notation and no type beside flags, and train's
help about the synthetic corpus of -c tiny (the newcomer audit of 2026-11-28, section 6). Through
the CLI, as a user runs it."""

from pathlib import Path
import os
import subprocess
import sys

import lenx

SRC = str(Path(lenx.__file__).resolve().parents[1])


def lenx_cli(*args):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=120, env=env)


def test_version():
    out = lenx_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"lenx {lenx.__version__}"


def test_usage_lines_name_arguments_in_capitals():
    usages = {cmd: next(line.strip() for line in lenx_cli(cmd, "--help").stdout.splitlines() if "Usage:" in line)
              for cmd in ("eval", "prepare", "export", "compare", "train")}
    assert usages == {"eval": "Usage: lenx eval [OPTIONS] [RUN]", "prepare": "Usage: lenx prepare [OPTIONS] CORPUS",
                      "export": "Usage: lenx export [OPTIONS] RUN DIR",
                      "compare": "Usage: lenx compare [OPTIONS] RUN_OR_FOLDER...", "train": "Usage: lenx train [OPTIONS]"}
    assert "Missing argument 'CORPUS'" in lenx_cli("prepare").stderr


def test_flags_show_no_type_and_train_help_names_the_synthetic_corpus():
    for cmd in ([], ["train"], ["prepare"]):
        text = lenx_cli(*cmd, "--help").stdout
        assert "--help" in text and "<bool>" not in text, cmd
    train = " ".join(lenx_cli("train", "--help").stdout.replace("│", " ").split())
    assert "tiny (for a CPU) trains on the token-level synthetic corpus" in train
    assert "--set data.corpus=NAME" in train
