"""MTA exported to transformers: the folder's model (lenx's own modelling code, processor included)
gives lenx's logits, and greedy and beam generation with its cache (which keeps MTA's queries) give
lenx's tokens, alone and in a left-padded batch; with the post-softmax convolution too."""

import pytest
import torch

from export_helpers import load, write_model
from helpers import V, model_for
from lenx.model.generate import generate

pytest.importorskip("transformers")


@pytest.mark.parametrize("method,post", [("mta", False), ("mta-kerple", False), ("mta-kerple", True)])
def test_logits_and_generation_are_lenx_s(method, post, tmp_path):
    lm = model_for(method, mta_head_mix="both", mta_post_conv=post).float()
    hf = load(write_model(lm, tmp_path / method))
    idx = torch.randint(0, V, (2, 19))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, lm(idx)[0], atol=1e-5, rtol=0)
    for prompt in (idx[:1, :7], idx[:, :5]):
        want = generate(lm, prompt, 12, temperature=0)["tokens"]
        got = hf.generate(prompt, max_new_tokens=12, do_sample=False)
        assert torch.equal(got[:, prompt.shape[1]:], want), method


def test_beams_and_a_growing_cache_keep_the_queries(tmp_path):
    """A cache that grows (LenxCache moves it into a larger one) and beam search (which reorders
    it) must both carry MTA's cached queries: the cached logits and beams equal the uncached ones."""
    lm = model_for("mta").float()
    hf = load(write_model(lm, tmp_path / "m"))
    idx = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        out = hf(idx[:, :6], use_cache=True)  # a cache of exactly 6 tokens
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        grown = hf(idx[:, 6:], past_key_values=cache, use_cache=True).logits
        assert cache.kv.capacity > 6
        torch.testing.assert_close(grown, lm(idx)[0][:, 6:], atol=1e-5, rtol=0)
    prompt = idx[:1, :6]
    beams = [hf.generate(prompt, max_new_tokens=8, do_sample=False, num_beams=3, use_cache=c) for c in (True, False)]
    assert torch.equal(beams[0], beams[1])
