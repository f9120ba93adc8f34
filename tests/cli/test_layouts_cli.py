"""Layouts through the CLI as a user runs them: `lenx list` shows the presets, and `lenx train` on the
tiny config with `--set model.layers=...` trains every layer as the layout says (meta.json), in a run
folder named after the layout."""

import json
import os
from pathlib import Path
import subprocess
import sys

import lenx

SRC = str(Path(lenx.__file__).resolve().parents[1])


def run(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


def test_list_shows_every_preset_with_its_layers():
    from lenx.attention.layouts import PRESETS

    out = run("list")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.stdout.splitlines() if line.startswith("│")]
    for name, preset in PRESETS.items():
        assert [name, preset.layers] in [r[:2] for r in rows], name


def test_train_with_a_layout_on_the_tiny_config(tmp_path):
    sets = ["model.layers=2*(rope),nope,alibi", "model.n_layer=4", "model.rope_fraction=0.5", "train.steps=2",
            "train.device=cpu", "train.log_every=1"]
    out = run("train", "-c", "tiny", *[a for s in sets for a in ("--set", s)], "--no-progress", cwd=tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    folder = tmp_path / "runs" / "synthetic-2_rope_nope_alibi-T64"  # no , * ( : in a folder name
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["layers"] == [{"method": m, "window": 0} for m in ("rope", "rope", "nope", "alibi")]
    assert 'layers = "2*(rope),nope,alibi"' in (folder / "config.toml").read_text()


def test_a_sweep_refuses_a_layout_that_would_make_its_runs_one_model(tmp_path):
    out = run("sweep", "--methods", "rope,alibi", "-c", "tiny", "--set", "model.layers=rope,nope", "-o", "sweep",
              cwd=tmp_path)
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: model.layers=rope,nope"), out.stderr
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "data").exists()
