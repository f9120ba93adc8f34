"""CHE with per-layer layouts: each layer of the encoder built with its own method (and causal or not
by it), and `lenx che --methods` taking a layout in parentheses or a preset, as a user runs it."""

import json
import os
from pathlib import Path
import subprocess
import sys

import pytest
import torch

from lenx.che.protocol import CHEError, Encoder, make_config, run_che

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_each_encoder_layer_has_its_method_and_direction():
    cfg = make_config("smoke", tasks=["parity_check"], methods=["(cope,rope)"], n_layer=4)
    model = Encoder("(cope,rope)", 4, 2, cfg)
    assert [(b.attn.spec.name, b.attn.cfg.causal) for b in model.blocks] == [("cope", True), ("rope", False)] * 2
    plain = Encoder("kerple", 4, 2, cfg)
    assert {(b.attn.spec.name, b.attn.cfg.causal) for b in plain.blocks} == {("kerple", False)}
    torch.manual_seed(0)
    x = torch.randint(0, 3, (1, 12))
    assert model(x).shape == (1, 12, 2)
    windowed = Encoder("(rope:w4,nope)", 4, 2, cfg)  # a window keeps the most recent keys: it runs causally
    assert [(b.attn.cfg.window, b.attn.cfg.causal) for b in windowed.blocks] == [(4, True), (0, False)] * 2


def test_a_bad_layout_is_refused_before_any_training(tmp_path):
    cfg = make_config("smoke", tasks=["parity_check"], methods=["(rope,kerpel)"], steps=1, test_max_length=41,
                      test_samples=4)
    with pytest.raises(CHEError, match=r"layer 1 \(kerpel\)"):
        run_che(cfg, tmp_path, progress=False)
    smol = make_config("smoke", tasks=["parity_check"], methods=["smollm3"], n_layer=2)
    with pytest.raises(CHEError, match="does not divide model.n_layer = 2"):
        run_che(smol, tmp_path, progress=False)
    assert not (tmp_path / "runs.jsonl").exists()


def test_the_cli_runs_a_layout_beside_a_method(tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "lenx", "che", "--tasks", "parity_check", "--methods",
                          "rope,(rope:w8,nope)", "--steps", "2", "--test-max-length", "44", "--test-length-step", "3",
                          "--test-samples", "4", "--no-progress", "-o", "che"], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path, env=env)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    runs = json.loads((tmp_path / "che" / "che.json").read_text())["runs"]
    assert sorted(r["method"] for r in runs) == ["(rope:w8,nope)", "rope"]
