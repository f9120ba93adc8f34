"""`lenx list` piped (a log, `| less`): rows of a readable width, no cell cut (the newcomer audit of
2026-11-28 measured rows of 409 characters). Through the CLI, as a user runs it."""

import os
from pathlib import Path
import subprocess
import sys

import lenx

SRC = str(Path(lenx.__file__).resolve().parents[1])


def test_piped_list_is_at_most_160_wide_and_keeps_every_name_whole():
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("COLUMNS", None)
    out = subprocess.run([sys.executable, "-m", "lenx", "list"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= 160 and "…" not in out.stdout
    from lenx.attention import all_methods

    names = {line.split("│")[1].strip() for line in lines if line.startswith("│") and line.split("│")[1].strip()}
    assert set(all_methods()) <= names  # every method's name on one line, as typed back
    assert "gluon on sm_90" in " ".join(out.stdout.replace("│", " ").split())  # wrapped, not cut
