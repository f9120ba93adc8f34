"""A KV cache that grows (an export's LenxCache.reserve: a larger cache, each layer's copy_from the old)
keeps what each layer decodes from: keys and values, MTA's queries, FoX's per-slot extras, a windowed
layer's ring (MTA's with its queries). Decoding on after the growth equals the full forward (float64)."""

import pytest
import torch

import lenx.model.lm as lm_module
from helpers import V, assert_close, model_for


@pytest.mark.parametrize("method, extra", [
    ("fox", {}), ("fox", {"fox_kv_shift": True}), ("mta", {}), ("pope", {}), ("dapev2-kerple", {"window": 4}),
    ("mta", {"window": 4}), ("fox", {"window": 4, "fox_kv_shift": True}), ("dapev2-fox", {"window": 3}),
])
def test_decoding_goes_on_after_the_cache_grows(method, extra, monkeypatch):
    monkeypatch.setattr(lm_module, "RING_ROWS", 2)  # rings smaller than the prompt: they wrap
    model = model_for(method, **extra)
    T, first = 14, 6
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        small = model.new_cache(2, first)
        model.prefill(idx[:, :first], small)
        cache = model.new_cache(2, T)
        for dst, src in zip(cache.layers, small.layers):
            dst.copy_from(src, first)
        cache.tokens[:, :first], cache.length = small.tokens[:, :first], first
        steps = [model.decode(idx[:, i:i + 1], cache)[:, 0] for i in range(first, T)]
        ref = [model(idx[:, :i + 1])[0][:, -1] for i in range(first, T)]
    for i, (got, want) in enumerate(zip(steps, ref)):
        assert_close(got, want, 1e-9, f"{method} {extra} step {first + i}")


def test_beam_search_reorders_fox_s_extras():
    """LenxCache.reorder_cache (beam search) keeps each sequence's FoX sums with its keys."""
    pytest.importorskip("transformers")
    from lenx.export.hf import LenxCache

    model = model_for("fox", fox_kv_shift=True)
    idx = torch.randint(0, V, (3, 5), generator=torch.Generator().manual_seed(6))
    cache = LenxCache(8)
    with torch.no_grad():
        cache.reserve(model, 3, 5)
        model.prefill(idx, cache.kv)
    before = [dict(layer.extra) for layer in cache.kv.layers]
    beams = torch.tensor([2, 0, 0])
    cache.reorder_cache(beams)
    for layer, kept in zip(cache.kv.layers, before):
        assert set(layer.extra) == {"c", "x"}
        for name, value in kept.items():
            assert torch.equal(layer.extra[name], value[beams]), name
