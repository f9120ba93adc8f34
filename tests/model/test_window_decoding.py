"""Decoding a windowed model: each windowed layer keeps a ring of slots that does not grow with the
context, and every step equals the full forward (float64), token by token, in blocks longer than a
ring step, from a left-padded batch and with the static step a CUDA graph captures."""

import pytest
import torch

import lenx.model.lm as lm_module
from helpers import V, assert_close, assert_static_step_decodes, decode_steps_and_block, model_for
from lenx.attention.cache import RingCache

METHODS = ["rope", "kerple", "alibi", "dapev2-kerple", "stickbreaking"]
T, W = 40, 5


@pytest.fixture(autouse=True)
def small_ring(monkeypatch):
    monkeypatch.setattr(lm_module, "RING_ROWS", 4)  # a ring far smaller than the context


def last_row(model, idx):
    with torch.no_grad():
        return model(idx)[0][:, -1]


@pytest.mark.parametrize("method", METHODS)
def test_windowed_decoding_equals_the_full_forward(method):
    model = model_for(method, window=W, dape_kernel=5)
    idx = torch.randint(0, V, (2, T))
    # the block holds more tokens than a ring step: decoded in pieces
    steps, cache, block = decode_steps_and_block(model, idx)
    with torch.no_grad():
        block_ref = model(idx[:, :36])[0][:, 25:]
    for i, logits in enumerate(steps):
        assert_close(logits, last_row(model, idx[:, :i + 1]), 1e-9, f"{method} step {i}")
    assert_close(block, block_ref, 1e-9, f"{method} a block of 11")
    ring = model.halo + 4 + W - 1 + model.halo  # RING_ROWS = 4
    assert all(isinstance(layer, RingCache) and layer.k.shape[2] == ring for layer in cache.layers)


PRO = dict.fromkeys(["fox_output_gate", "fox_qk_norm", "fox_kv_shift", "fox_output_norm"], True)
FOX = [("fox", {}), ("fox", PRO), ("dapev2-fox", {"dape_kernel": 5, "fox_kv_shift": True}),
       ("stickbreaking-fox", {}), ("dapev2-stickbreaking-fox", PRO), ("dape-fox", {})]


@pytest.mark.parametrize("window", [1, 5, T - 1, T + 9])
@pytest.mark.parametrize("method,switches", FOX)
def test_windowed_fox_decodes_as_the_full_forward(method, switches, window):
    """The ring keeps each slot's forget-gate sum c (and under the key/value shift its input x) with
    its key: token by token past the window, and a block decoded in pieces after a prompt longer
    than the ring, equal the full forward (float64)."""
    model = model_for(method, window=window, **switches)
    idx = torch.randint(0, V, (2, T))
    # the block holds more tokens than a ring step: decoded in pieces
    steps, cache, block = decode_steps_and_block(model, idx)
    with torch.no_grad():
        block_ref = model(idx[:, :36])[0][:, 25:]
    for i, logits in enumerate(steps):
        assert_close(logits, last_row(model, idx[:, :i + 1]), 1e-9, f"{method} W{window} step {i}")
    assert_close(block, block_ref, 1e-9, f"{method} W{window} a block of 11")
    ring = 2 * model.halo + 4 + window - 1  # RING_ROWS = 4
    for layer in cache.layers:
        assert isinstance(layer, RingCache) and layer.k.shape[2] == min(ring, T)
        assert all(kept.shape[1] == layer.k.shape[2] for kept in layer.extra.values())
        assert set(layer.extra) == ({"c", "x"} if switches.get("fox_kv_shift") else {"c"})


@pytest.mark.parametrize("method,switches", [("kerple", {}), ("dapev2-kerple", {"dape_kernel": 3}),
                                             ("stickbreaking", {})] + FOX[1:3])
def test_a_padded_batch_decodes_with_the_static_step(method, switches):
    assert_static_step_decodes(model_for(method, window=W, **switches))


def test_the_ring_does_not_grow_with_the_context():
    model = model_for("rope", window=W)
    small, large = model.new_cache(1, 64), model.new_cache(1, 4096)
    assert small.layers[0].k.shape == large.layers[0].k.shape
    fox = model_for("fox", window=W, fox_kv_shift=True)
    small, large = fox.new_cache(1, 64).layers[0], fox.new_cache(1, 4096).layers[0]
    assert small.k.shape == large.k.shape and small.extra.keys() == large.extra.keys() == {"c", "x"}
    assert all(small.extra[n].shape == large.extra[n].shape for n in small.extra)
    assert model_for("rope").new_cache(1, 4096).layers[0].k.shape[2] == 4096


def test_decoding_refuses_segments():
    model = model_for("rope", window=W)
    cache = model.new_cache(1, 8)
    with pytest.raises(ValueError, match="decoding has no document segments"):
        model.blocks[0].attn(torch.zeros(1, 3, 16, dtype=torch.float64), cache.layers[0],
                             segments=torch.zeros(1, 3, dtype=torch.long))


def test_the_memory_check_counts_the_rings(monkeypatch):
    """`lenx generate`'s check counts a windowed layer's ring, not a slot per token: a long generation
    that a global model could not hold passes with a window."""
    from lenx.config import ConfigError, load_config
    from lenx.model import memory
    from lenx.model.generate import check_generate_memory

    monkeypatch.setattr(memory, "available_memory", lambda device: 50 * 2**20)
    cpu = torch.device("cpu")
    check_generate_memory(load_config("tiny", ["model.window=16"]), 1, 10, 100_000, cpu)
    check_generate_memory(load_config("tiny", ["model.layers=rope:w16"]), 1, 10, 100_000, cpu)  # a layout's windows
    with pytest.raises(ConfigError, match="KV cache"):
        check_generate_memory(load_config("tiny"), 1, 10, 100_000, cpu)


def test_the_memory_check_counts_what_each_method_keeps_per_slot(monkeypatch):
    """FoX's sums and shifted inputs, MTA's queries and PoPE's wider keys are cache too: with room for
    Kerple's keys and values only, those refuse and Kerple passes."""
    from lenx.config import ConfigError, load_config
    from lenx.model import generate, memory

    cpu = torch.device("cpu")
    cfg = load_config("tiny", ["model.method=kerple"])
    reading = memory.estimate_memory(cfg.model, 1, 10, cpu, cfg.train.precision, training=False).total
    slots, item = 10 + 100_000, 4
    kerple = cfg.model.n_layer * slots * 2 * cfg.model.d_model * item + slots * 8
    monkeypatch.setattr(memory, "available_memory", lambda device: reading + kerple + 1000)
    generate.check_generate_memory(cfg, 1, 10, 100_000, cpu)
    for extra in (["model.method=fox", "model.fox_kv_shift=true"], ["model.method=mta"], ["model.method=pope"]):
        with pytest.raises(ConfigError, match="KV cache"):
            generate.check_generate_memory(load_config("tiny", extra), 1, 10, 100_000, cpu)


@pytest.mark.parametrize("method", ["ssmax-rope", "logn-kerple", "l4temp-rope"])
def test_a_windowed_query_temperature_counts_the_window_s_keys(method):
    """Under a window a row sees min(position + 1, W) keys: its temperature counts those, in the
    full forward and in decoding alike."""
    short = dict(temp_train_len=2, temp_floor_scale=2.0, temp_attn_scale=0.3)
    model = model_for(method, window=W, **short)
    attn = model.blocks[0].attn
    x = torch.randn(1, T, attn.qkv.in_features, dtype=torch.float64)
    q, _, _ = attn.project(x)
    with torch.no_grad():
        bare, _, _ = attn._qkv(x)
        if attn.rope is not None:
            bare, _ = attn.rope(bare, bare, torch.arange(T))
    seen = torch.arange(1, T + 1).clamp(max=W)
    assert_close(q, attn.temperature(bare, seen), 1e-12, "the window's key counts")
    idx = torch.randint(0, V, (2, T))
    with torch.no_grad():
        cache = model.new_cache(2, T)
        steps = [model.prefill(idx[:, :1], cache)] + [model.decode(idx[:, i:i + 1], cache)[:, 0] for i in range(1, T)]
    for i, logits in enumerate(steps):
        assert_close(logits, last_row(model, idx[:, :i + 1]), 1e-9, f"{method} step {i}")
