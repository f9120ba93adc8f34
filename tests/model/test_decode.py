"""Decoding with a KV cache equals the full forward, for every method (float64)."""

import pytest
import torch

from helpers import V, assert_close, model_for
from lenx.attention import all_methods

T = 40


def prefix_logits(model, idx, i):
    """The next-token logits after idx[:, :i + 1]: the last row of a full forward over them."""
    with torch.no_grad():
        return model(idx[:, : i + 1])[0][:, -1]


@pytest.mark.parametrize("method", all_methods())
def test_decoding_equals_the_full_forward(method):
    model = model_for(method)
    idx = torch.randint(0, V, (2, T))
    with torch.no_grad():
        full = model(idx)[0]
        # a prompt of one token, then one token at a time
        cache = model.new_cache(2, T)
        steps = [model.prefill(idx[:, :1], cache)]
        steps += [model.decode(idx[:, i:i + 1], cache)[:, 0] for i in range(1, T)]
        # a prompt longer than a typical training length here, then the rest three at a time and one by one
        cache2 = model.new_cache(2, T + 5)
        long_prompt = [model.prefill(idx[:, :25], cache2)]
        chunk = model.decode(idx[:, 25:28], cache2)
        rest = [model.decode(idx[:, i:i + 1], cache2)[:, 0] for i in range(28, T)]
    for i, logits in enumerate(steps):
        assert_close(logits, prefix_logits(model, idx, i), 1e-9, f"{method} step {i}")
    assert_close(long_prompt[0], prefix_logits(model, idx, 24), 1e-9, f"{method} prefill 25")
    with torch.no_grad():  # a block's rows are those of one forward over everything up to its end
        block_ref = model(idx[:, :28])[0][:, 25:]
    assert_close(chunk, block_ref, 1e-9, f"{method} block of 3")
    for i, logits in enumerate(rest, 28):
        assert_close(logits, prefix_logits(model, idx, i), 1e-9, f"{method} after a long prompt, step {i}")
    # the last step is the full forward's last row; with no halo, so is every step (see LM.halo)
    assert_close(steps[-1], full[:, -1], 1e-9, method)
    if model.halo == 0:
        assert_close(torch.stack(steps, 1), full, 1e-9, f"{method}: every position")


def test_dapev2_halo_follows_the_kernel():
    assert model_for("dapev2-kerple", dape_kernel=5).halo == 2
    assert model_for("dape-kerple").halo == 0 and model_for("kerple").halo == 0


def test_decoding_refuses_what_cannot_decode():
    with pytest.raises(ValueError, match="cannot decode"):
        model_for("dapev2-kerple", dape_leak=True).new_cache(1, 8)
    model = model_for("rope")
    cache = model.new_cache(1, 4)
    with pytest.raises(ValueError, match="does not fit"):
        model.prefill(torch.zeros(1, 5, dtype=torch.long), cache)
    model.prefill(torch.zeros(1, 3, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="do not fit"):
        model.decode(torch.zeros(1, 2, dtype=torch.long), cache)


@pytest.mark.parametrize("small_scores", [1 << 24, 0])
def test_the_growing_step_keeps_sdpa_off_cudnn(monkeypatch, small_scores):
    """LM.decode's key count grows every token: cuDNN's SDPA would build a plan per step (~4 ms a
    layer on an H100), so the eager step runs SDPA with cuDNN off, and with only the plain product
    while its scores are small (the memory-efficient kernel walks all keys in one block per head);
    the static step's shapes are fixed, so it leaves the choice to PyTorch."""
    from lenx.attention import cache as cache_module
    monkeypatch.setattr(cache_module, "_SMALL_SCORES", small_scores)
    seen = []
    sdpa = cache_module.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        b = torch.backends.cuda
        seen.append((b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled()))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(cache_module.F, "scaled_dot_product_attention", spy)
    model = model_for("rope")
    idx = torch.randint(0, V, (1, 6))
    with torch.no_grad():
        cache = model.new_cache(1, 8)
        model.prefill(idx[:, :3], cache)
        seen.clear()
        model.decode(idx[:, 3:4], cache)
        growing = {(False, False, False, True)} if small_scores else {(False, True, True, True)}
        assert seen and set(seen) == growing
        seen.clear()
        model.static_step(idx[:, 4], cache, torch.tensor(4))
        assert seen and set(seen) == {(True, True, True, True)}
