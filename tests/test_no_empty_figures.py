"""No empty figures: a sweep evaluated only up to its training length has no ΔP to draw, so it
writes no ΔP figure (it used to write an empty one); with a longer length it does."""

import json
import os
from pathlib import Path
import subprocess
import sys

import lenx

SRC = str(Path(lenx.__file__).resolve().parents[1])
TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.steps=2", "train.ckpt_every=2",
        "train.seq_len=32", "train.batch_size=4", "eval.windows=2", "eval.scored=8", "data.root='data'"]


def sweep(cwd: Path, out: str, *extra: str):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    sets = [a for o in TINY + list(extra) for a in ("--set", o)]
    done = subprocess.run([sys.executable, "-m", "lenx", "sweep", "--methods", "rope", "-c", "tiny", *sets,
                           "-o", out, "--no-progress"], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return cwd / out


def test_a_sweep_without_delta_p_draws_no_delta_p_figure(tmp_path):
    flat = sweep(tmp_path, "flat", "eval.max_length=32")
    assert (flat / "perplexity.png").is_file() and (flat / "loss.png").is_file()
    assert not (flat / "delta_p.png").exists()
    assert all("delta_p" not in row for r in json.loads((flat / "results.json").read_text())["runs"]
               for row in r["results"].values())
    longer = sweep(tmp_path, "longer", "eval.max_length=64")
    assert (longer / "delta_p.png").is_file()
