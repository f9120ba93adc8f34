"""Query temperatures and PoPE under transformers: an exported folder gives lenx's logits and greedy
tokens (its code is lenx's own, so the temperature and PoPE's transform apply there too, in the full
forward and in generate()'s cache), and `lenx export` of a trained log-n run, run as a user does,
carries the run's training length, past which the temperature acts."""

from dataclasses import replace
import json
import os
from pathlib import Path
import subprocess
import sys

import pytest
import torch

from conftest import TINY
from export_helpers import load, write_model
from helpers import V, model_for
from lenx.model.generate import generate

pytest.importorskip("transformers")

SRC = Path(__file__).resolve().parents[2] / "src"
SHORT = dict(temp_train_len=8, temp_floor_scale=4.0)  # factors that move within the 19 tokens tested
METHODS = ["ssmax-rope", "logn-kerple", "l4temp-rope", "ssmax-dapev2-kerple", "pope", "dapev2-pope", "logn-pope",
           "stickbreaking-pope"]


@pytest.mark.parametrize("method", METHODS)
def test_logits_and_greedy_generation_are_lenx_s(method, tmp_path):
    lm = model_for(method, **SHORT).float()
    hf = load(write_model(lm, tmp_path / method))
    assert hf.config.lenx["temp_train_len"] == 8
    idx = torch.randint(0, V, (2, 19))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, lm(idx)[0], atol=1e-5, rtol=0)
    for prompt in (idx[:1, :7], idx[:, :5]):
        want = generate(lm, prompt, 12, temperature=0)["tokens"]
        got = hf.generate(prompt, max_new_tokens=12, do_sample=False)
        assert torch.equal(got[:, prompt.shape[1]:], want), method


def test_lenx_export_of_a_log_n_run_keeps_its_training_length(words_root, tmp_path):
    from lenx.config import load_config
    from lenx.model import LM
    from lenx.runs import load_run
    from lenx.training.loop import train

    train(load_config("tiny", TINY + ["model.method=logn-rope", f"data.root={str(words_root)!r}"]),
          tmp_path / "runs" / "logn", progress=False)
    saved = (tmp_path / "runs" / "logn" / "config.toml").read_text()
    assert "temp_train_len = 32" in saved  # train.seq_len, written in when the run was configured
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "lenx", "export", "../runs/logn", "../folder"], capture_output=True,
                         text=True, timeout=600, cwd=elsewhere, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    config = json.loads((tmp_path / "folder" / "config.json").read_text())
    assert config["lenx"]["method"] == "logn-rope" and config["lenx"]["temp_train_len"] == 32
    lm, _ = load_run(tmp_path / "runs" / "logn", torch.device("cpu"))
    hf = load(tmp_path / "folder")
    idx = torch.randint(0, lm.cfg.vocab_size, (1, 80))  # past 32: the temperature acts (log_32 80 = 1.26)
    cooler = LM(replace(lm.cfg, temp_train_len=1000)).eval()  # the same weights, no temperature up to 1000
    cooler.load_state_dict(lm.state_dict())
    with torch.no_grad():
        got, want, cool = hf(idx).logits, lm(idx)[0], cooler(idx)[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert torch.equal(want[:, :32], cool[:, :32]) and not torch.allclose(want[:, 40:], cool[:, 40:], atol=1e-4)
