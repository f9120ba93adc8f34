"""A layout entry's window (`rope:w4`) masks its layer as model.window does: the layer's output is the
dense softmax under a window mask built by hand, decoding equals the full forward (float64) from a ring
of slots in the windowed layers only (FoX's ring keeps its per-slot extras, MTA's its queries; a
layout may mix the two), and a window on every method passes the config checks."""

import math

import pytest
import torch

import lenx.model.lm as lm_module
from helpers import V, assert_close, model_for
from lenx.attention import Attention
from lenx.attention.cache import LayerCache, RingCache
from lenx.config import AttentionConfig, LMConfig, RunConfig
from lenx.model import check_config


def test_a_layout_window_masks_its_layer_only():
    model = model_for("rope", layers="rope:w4,nope")
    windowed, dense = (b.attn for b in model.blocks)
    assert (windowed.parts.window, dense.parts.window) == (4, 0)
    T = 11
    x = torch.randn(2, T, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got = windowed(x)
        q, k, v = windowed.project(x)
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        allowed = (j <= i) & (i - j < 4)  # the window by hand: each row's 4 most recent keys, itself included
        raw = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        out = torch.softmax(raw.masked_fill(~allowed, -math.inf), -1) @ v
        want = windowed.proj(out.transpose(1, 2).reshape(2, T, 16))
        unmasked = torch.softmax(raw.masked_fill(j > i, -math.inf), -1) @ v  # causal only
    assert_close(got, want, 1e-12, "rope:w4 layer 0")
    assert not torch.allclose(out, unmasked)  # the window changed something at T = 11


@pytest.mark.parametrize("layers", ["rope:w8,nope", "dapev2-kerple:w5,rope", "pope:w6,alibi", "fox:w4,fox",
                                    "mta-kerple:w6,rope"])
def test_a_windowed_layout_decodes_as_its_full_forward(layers, monkeypatch):
    """Token by token and in a block longer than a ring step: every step is the full forward's row;
    the windowed layer decodes from a ring (PoPE's keys 2d wide), the other from every slot."""
    monkeypatch.setattr(lm_module, "RING_ROWS", 4)
    model = model_for("rope", layers=layers, dape_kernel=3)
    T = 30
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        cache = model.new_cache(2, T)
        steps = [model.prefill(idx[:, :3], cache)] + [model.decode(idx[:, i:i + 1], cache)[:, 0] for i in range(3, T)]
        ref = [model(idx[:, :i + 1])[0][:, -1] for i in range(2, T)]
        long = model.new_cache(2, T)
        model.prefill(idx[:, :12], long)
        block = model.decode(idx[:, 12:25], long)  # 13 tokens: pieces of RING_ROWS
        block_ref = model(idx[:, :25])[0][:, 12:]
    for n, (got, want) in enumerate(zip(steps, ref)):
        assert_close(got, want, 1e-9, f"{layers} step {n}")
    assert_close(block, block_ref, 1e-9, f"{layers} block")
    ring, full = cache.layers
    assert isinstance(ring, RingCache) and ring.k.shape[2] < T and type(full) is LayerCache
    assert ring.k.shape[-1] == model.blocks[0].attn.key_dim
    assert ring.extra.keys() == full.extra.keys()  # FoX's c rides in the ring as in the full cache


def test_a_windowed_fox_layer_and_a_windowed_mta_layer_decode_as_the_full_forward(monkeypatch):
    """One layout, both kinds of what a ring keeps beside K and V: FoX's per-slot c and MTA's queries,
    each ring smaller than the context so that both wrap (FoX's Pro options, x under the key/value
    shift, apply to every layer, so they cannot go beside MTA: test_window_decoding has them)."""
    monkeypatch.setattr(lm_module, "RING_ROWS", 2)
    model = model_for("rope", layers="fox:w4,mta-kerple:w5")
    T = 24
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        cache = model.new_cache(2, T)
        steps = [model.prefill(idx[:, :5], cache)] + [model.decode(idx[:, i:i + 1], cache)[:, 0] for i in range(5, T)]
        ref = [model(idx[:, :i + 1])[0][:, -1] for i in range(4, T)]
        long = model.new_cache(2, T)
        model.prefill(idx[:, :9], long)
        block = model.decode(idx[:, 9:20], long)  # 11 tokens: pieces of RING_ROWS
        block_ref = model(idx[:, :20])[0][:, 9:]
    for n, (got, want) in enumerate(zip(steps, ref)):
        assert_close(got, want, 1e-9, f"step {n}")
    assert_close(block, block_ref, 1e-9, "block")
    fox, mta = cache.layers
    assert isinstance(fox, RingCache) and isinstance(mta, RingCache)
    assert fox.capacity < T and mta.capacity < T
    assert set(fox.extra) == {"c"} and fox.q is None
    assert not mta.extra and mta.q is not None and mta.q.shape[2] == mta.capacity


@pytest.mark.parametrize("method", ["fox", "dapev2-fox", "mta", "mta-kerple"])
def test_a_window_on_fox_and_mta_passes_the_checks(method):
    """Nothing refuses a window any more: the layer builds, and so does the run's config."""
    assert Attention(AttentionConfig(method=method, window=4), 2, 16).parts.window == 4
    for model in ({"method": method, "window": 8}, {"layers": f"{method}:w8,rope"}):
        cfg = RunConfig()
        cfg.model = LMConfig(**({"n_layer": 2, "n_head": 2, "d_model": 16, "mta_every": 1} | model))
        check_config(cfg)
