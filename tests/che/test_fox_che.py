"""FoX in CHE: it has no bidirectional form (its forget gates decay the keys behind each query), so
the encoder runs it causally, as stick-breaking and CoPE (the registry's causal_only); `lenx che`
runs it and its compositions from the CLI, and `lenx list` names it with its paper."""

import json
import os
import re
from pathlib import Path
import subprocess
import sys

import torch

from lenx.che.protocol import Encoder, make_config, runs_causally

SRC = Path(__file__).resolve().parents[2] / "src"


def lenx(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


def test_fox_runs_causally_in_the_encoder():
    assert all(runs_causally(m) for m in ("fox", "dapev2-fox", "stickbreaking-fox"))
    cfg = make_config("smoke", n_layer=1)
    torch.manual_seed(0)
    model = Encoder("dapev2-fox", 4, 2, cfg).eval()
    assert all(block.attn.cfg.causal for block in model.blocks)
    x = torch.randint(0, 3, (1, 12))
    y = x.clone()
    y[0, 5] = (y[0, 5] + 1) % 3
    with torch.no_grad():
        out_x, out_y = model(x), model(y)
    assert torch.equal(out_x[0, :5], out_y[0, :5])  # positions before the change are untouched
    assert not torch.allclose(out_x[0, -1], out_y[0, -1])  # the answer positions read the whole input


def test_lenx_che_runs_fox_from_the_cli(tmp_path):
    out = lenx("che", "--tasks", "parity_check", "--methods", "fox,dapev2-fox", "--steps", "2",
               "--test-max-length", "44", "--test-length-step", "3", "--test-samples", "4", "--no-progress",
               "--out", "che_fox", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = json.loads((tmp_path / "che_fox" / "che.json").read_text())["runs"]
    assert {r["method"] for r in runs} == {"fox", "dapev2-fox"}
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in runs)


def test_lenx_list_names_fox_with_its_paper(tmp_path):
    out = lenx("list", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows: dict[str, str] = {}  # a method's description, its wrapped lines joined
    name = None
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in re.split("[│|]", line)]
        if len(cells) > 4:
            name = cells[1] or name
            rows[name] = (rows.get(name, "") + " " + cells[2]).strip()
    for method in ("fox", "dape-fox", "dapev2-fox", "stickbreaking-fox"):
        assert "FoX" in rows[method] and "Lin et al. 2025, arXiv 2503.02130" in rows[method], rows[method]
