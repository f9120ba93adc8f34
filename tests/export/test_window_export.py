"""A windowed model exported to transformers: its cache grows and reorders with each windowed
layer's ring (MTA's with its queries), and every step's logits are those of a full forward."""

import pytest
import torch

import lenx.model.lm as lm_module
from export_helpers import load, write_model
from helpers import V, model_for
from lenx.model.generate import generate

pytest.importorskip("transformers")


@pytest.mark.parametrize("method", ["rope", "dapev2-kerple", "mta"])
def test_a_windowed_export_grows_its_cache_and_generates_lenx_s_tokens(method, tmp_path, monkeypatch):
    from lenx.export.hf import LenxCache

    monkeypatch.setattr(lm_module, "RING_ROWS", 4)  # rings far smaller than the context
    lm = model_for(method, window=4).float()
    hf = load(write_model(lm, tmp_path / "m"))
    idx = torch.randint(0, V, (2, 30))
    cache = LenxCache(8)
    with torch.no_grad():
        for a, b in ((0, 5), (5, 6), (6, 30)):  # a cache made for 8 tokens grows to 30, rings copied over
            step = hf(idx[:, a:b], cache=cache, use_cache=True)
            torch.testing.assert_close(step.logits[:, -1], lm(idx[:, :b])[0][:, -1], atol=1e-5, rtol=0)
    assert cache.length == 30 and cache.kv.layers[0].k.shape[2] < 30
    prompt = idx[:1, :7]
    want = generate(lm, prompt, 16, temperature=0)["tokens"]
    assert torch.equal(hf.generate(prompt, max_new_tokens=16, do_sample=False)[:, 7:], want)
    beams = [hf.generate(prompt, max_new_tokens=8, do_sample=False, num_beams=3, use_cache=c) for c in (True, False)]
    assert torch.equal(beams[0], beams[1])
