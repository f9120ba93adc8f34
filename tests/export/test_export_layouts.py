"""A model with a per-layer layout and partial RoPE, end to end as a user runs it: `lenx train --set
model.layers=...`, meta.json's layers, `lenx eval`, `lenx generate`, `lenx plot --attention` of one
layer, `lenx export` (the folder knows each layer's method: same logits and generation through
transformers) and `lenx eval --hf` with the run's numbers; and a bad layout's one-line error before
any work."""

import json
import os

import pytest
import torch

from conftest import TINY
from export_helpers import load, write_model
from test_export_eval import same_numbers
from test_export_run import lenx, one_line_error

pytest.importorskip("transformers")

LAYOUT = ["model.n_layer=4", "model.layers=t5,rope,dapev2-kerple,nope", "model.rope_fraction=0.5"]


def test_an_exported_layout_gives_lenx_s_logits_and_generation(tmp_path):
    """Each layer rebuilt from the folder's config with its own method (RoPE's computed buffers of
    its rotated dims restored too), T5's table shared by its layers."""
    from lenx.config import LMConfig
    from lenx.model import LM
    from lenx.model.generate import generate

    torch.manual_seed(0)
    lm = LM(LMConfig(vocab_size=50, n_layer=4, n_head=2, d_model=16, dape_hidden=4, layers="t5,rope,dapev2-kerple,nope",
                     rope_fraction=0.5)).eval()
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(0.2 * torch.randn_like(p))
    hf = load(write_model(lm, tmp_path / "m"))
    assert [b.attn.spec.name for b in hf.model.blocks] == ["t5", "rope", "dapev2-kerple", "nope"]
    assert hf.model.blocks[1].attn.rope.rotary == 4 and hf.model.blocks[0].attn.bias is not None
    ids = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, lm(ids)[0], atol=1e-5, rtol=0)
    want = generate(lm, ids[:1, :8], 6, temperature=0)["tokens"][0].tolist()
    got = hf.generate(ids[:1, :8], max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert got[0, 8:].tolist() == want


def test_a_layout_trains_evaluates_generates_exports_and_measures_from_the_cli(words_root, tmp_path):
    where = tmp_path / "elsewhere"
    where.mkdir()
    data = os.path.relpath(words_root, where)
    sets = [a for s in TINY + LAYOUT + [f"data.root={data!r}", "train.keep_every=0"] for a in ("--set", s)]
    out = lenx("train", "-c", "tiny", *sets, "-o", "runs/layout", "--no-progress", cwd=where)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    meta = json.loads((where / "runs" / "layout" / "meta.json").read_text())
    assert meta["layers"] == [{"method": m, "window": 0} for m in ("t5", "rope", "dapev2-kerple", "nope")]
    evals = ("--lengths", "32,64", "--windows", "4", "--scored", "16", "--device", "cpu", "--no-progress")
    for args in (("eval", "runs/layout", *evals),
                 ("generate", "runs/layout", "--prompt", "north garden", "--max-new-tokens", "4", "--temperature", "0",
                  "--device", "cpu", "--json"),
                 ("plot", "runs/layout", "--attention", "--layer", "2", "--length", "16"),
                 ("export", "runs/layout", "models/layout"),
                 ("eval", "--hf", "models/layout", "--like", "runs/layout", "--out", "evals/layout", "--device", "cpu",
                  "--no-progress")):
        out = lenx(*args, cwd=where)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (args, out.stderr[-3000:])
        if args[0] == "generate":
            assert len(json.loads(out.stdout)["outputs"]) == 1
    maps = json.loads((where / "runs" / "layout" / "attention_L2_H0.json").read_text())
    assert maps["method"] == "dapev2-kerple" and "processed" in maps  # the layer's own method and maps
    mine = json.loads((where / "runs" / "layout" / "eval.json").read_text())
    assert mine["method"] == "t5,rope,dapev2-kerple,nope"  # results name the layout, not model.method
    same_numbers(mine, json.loads((where / "evals" / "layout" / "eval.json").read_text()))
    config = json.loads((where / "models" / "layout" / "config.json").read_text())
    assert config["lenx"]["layers"] == "t5,rope,dapev2-kerple,nope" and config["lenx"]["rope_fraction"] == 0.5
    assert config["method"] == "t5,rope,dapev2-kerple,nope"


@pytest.mark.parametrize("layout, needles", [
    ("rope,kerpel", ["model.layers: layer 1 (kerpel)", "unknown method"]),
    ("3*(rope:w64),nope", ["pattern of 4 layers", "model.n_layer = 2"]),
])
def test_a_bad_layout_is_one_line_before_any_work(tmp_path, layout, needles):
    out = lenx("train", "-c", "tiny", "--set", f"model.layers={layout}", "--set", "train.device=cpu", "-o", "run",
               cwd=tmp_path)
    one_line_error(out, *needles)
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()  # no corpus made, no run folder
