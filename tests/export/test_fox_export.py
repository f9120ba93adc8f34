"""FoX exported to transformers: the folder's logits are lenx's, and greedy generate() (lenx's KV
cache with the prefix sums kept) gives lenx's own tokens, alone and for a left-padded batch, with
and without the Pro block's options and a window (a ring that keeps the sums); and the CLI from
training to export."""

import json
import math
import os
from pathlib import Path
import subprocess
import sys

import pytest
import torch

from conftest import TINY
from export_helpers import load, write_model
import lenx.model.lm as lm_module
from helpers import V, model_for
from lenx.model.generate import generate

pytest.importorskip("transformers")

PRO = dict(fox_output_gate=True, fox_qk_norm=True, fox_kv_shift=True, fox_output_norm=True)
SRC = Path(__file__).resolve().parents[2] / "src"


def lenx(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


@pytest.mark.parametrize("method,switches", [("fox", {}), ("dapev2-fox", {}), ("stickbreaking-fox", {}),
                                             ("fox", PRO), ("fox", PRO | {"window": 3}),
                                             ("dapev2-fox", {"window": 4, "fox_kv_shift": True})])
def test_logits_and_generation_are_lenx_s(method, switches, tmp_path, monkeypatch):
    monkeypatch.setattr(lm_module, "RING_ROWS", 2)  # a windowed layer's ring smaller than the prompt: it wraps
    lm = model_for(method, **switches).float()
    hf = load(write_model(lm, tmp_path / method))
    assert all(getattr(hf.model.cfg, name) == on for name, on in switches.items())
    idx = torch.randint(0, V, (2, 19))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, lm(idx)[0], atol=1e-5, rtol=0)
    for prompt in (idx[:1, :7], idx[:, :5]):
        want = generate(lm, prompt, 10, temperature=0)["tokens"]
        got = hf.generate(prompt, max_new_tokens=10, do_sample=False)
        assert torch.equal(got[:, prompt.shape[1]:], want), method
    # a left-padded batch (the shorter prompt read alone at its own positions)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0
    got = hf.generate(idx[:, :7], attention_mask=mask, max_new_tokens=6, do_sample=False)[:, 7:]
    assert torch.equal(got[0], generate(lm, idx[:1, :7], 6, temperature=0)["tokens"][0])
    assert torch.equal(got[1], generate(lm, idx[1:, 3:7], 6, temperature=0)["tokens"][0])


def test_train_eval_generate_and_export_from_the_cli(words_root, tmp_path):
    """The commands as a user runs them, from another folder with relative paths: a FoX run with every
    Pro option trains, evaluates beyond its training length, generates and exports (the export checks
    its logits against the run's); a Pro option on another method is a one-line error before any work."""
    where = tmp_path / "work"
    where.mkdir()
    data = os.path.relpath(words_root, where)
    base = [f"--set={s}" for s in TINY + [f"data.root={data!r}"]]
    pro = [f"--set=model.{name}=true" for name in PRO]
    out = lenx("train", "-c", "tiny", *base, "--set=model.method='dapev2-fox'", *pro, "-o", "runs/fox", cwd=where)
    assert out.returncode == 0, out.stderr[-3000:]
    kept = (where / "runs/fox/config.toml").read_text()
    assert all(f"{name} = true" in kept for name in PRO), kept
    out = lenx("eval", "runs/fox", "--lengths", "32,64", "--windows", "2", cwd=where)
    assert out.returncode == 0, out.stderr[-3000:]
    ev = json.loads((where / "runs/fox/eval.json").read_text())
    assert ev["lengths"] == [32, 64] and set(ev["backends"]) == {"chunked"}  # the planner's route for FoX (per layer)
    assert all(math.isfinite(ev["results"][n]["ppl"]) for n in ("32", "64"))
    out = lenx("generate", "runs/fox", "--prompt", "river stone", "--max-new-tokens", "5", "--temperature", "0",
               cwd=where)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-3000:]
    out = lenx("export", "runs/fox", "models/fox", cwd=where)
    assert out.returncode == 0 and out.stdout.startswith("wrote models/fox: dapev2-fox"), out.stderr[-3000:]
    bad = lenx("train", "-c", "tiny", *base, "--set=model.method='kerple'", "--set=model.fox_kv_shift=true",
               "-o", "runs/bad", cwd=where)
    lines = bad.stderr.splitlines()
    assert bad.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: model.fox_kv_shift"), bad.stderr
    assert "fox method" in lines[0] and not (where / "runs/bad").exists()
