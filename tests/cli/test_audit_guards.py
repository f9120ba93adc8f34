"""The newcomer audit of 2026-11-28 on `plot --attention`, `demo` and `che`, run as a user runs them
(a subprocess from a scratch folder, relative paths): S2, S3, S6, S9, S11."""

import os
from pathlib import Path
import shutil
import subprocess
import sys

import lenx

SRC = str(Path(lenx.__file__).resolve().parents[1])
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "rope"


def lenx_cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


def one_line_error(out, *needles):
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_attention_maps_that_cannot_fit_are_refused_even_with_force(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "runs" / "r")
    before = sorted(p.name for p in (tmp_path / "runs" / "r").iterdir())
    line = one_line_error(lenx_cli("plot", "runs/r", "--attention", "--length", "100000", "--force", cwd=tmp_path),
                          "--length 100000 needs about", "GB available", "lower --length")
    assert "Traceback" not in line
    assert sorted(p.name for p in (tmp_path / "runs" / "r").iterdir()) == before


def test_demo_names_its_own_option(tmp_path):
    one_line_error(lenx_cli("demo", "--steps", "0", "-o", "d", cwd=tmp_path), "--steps must be >= 1")
    assert not (tmp_path / "d").exists()


def test_che_refuses_an_unbounded_test_and_duplicate_names(tmp_path):
    one_line_error(lenx_cli("che", "--tasks", "even_pairs", "--methods", "rope", "--test-max-length", "100000",
                            "--steps", "2", "-o", "c", cwd=tmp_path), "--test-max-length 100000", "--force")
    one_line_error(lenx_cli("che", "--tasks", "even_pairs,even_pairs", "--methods", "rope", "--steps", "2",
                            "-o", "c", cwd=tmp_path), "even_pairs more than once")
    one_line_error(lenx_cli("che", "--tasks", "even_pairs", "--methods", "rope,rope", "--steps", "2",
                            "-o", "c", cwd=tmp_path), "rope more than once")
    assert not (tmp_path / "c").exists()


def test_che_with_one_seed_shows_no_spread(tmp_path):
    out = lenx_cli("che", "--tasks", "parity_check", "--methods", "nope", "--seeds", "0", "--steps", "2",
                   "--test-max-length", "44", "--test-samples", "4", "--no-progress", "-o", "c", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    table = (tmp_path / "c" / "che.md").read_text()
    assert "±" not in table.split("one seed (no spread to show)")[1] and "parity_check" in table
