"""Every method, every backend it supports, against the dense reference; causality; the parts."""

import copy
import math

import pytest
import torch
from torch import nn

from helpers import assert_close
from lenx.attention import (
    Attention, AttentionConfig, DapeV2, T5Bias, UnknownMethodError, alibi_slopes, all_methods, parse_method,
)
from lenx.attention.backends import unsupported_reason
from lenx.attention.t5 import t5_bucket

METHODS = all_methods()
H, D_MODEL = 3, 24  # odd head count on purpose


def make_pair(method, backend, **kw):
    ref = Attention(AttentionConfig(method=method, backend="dense", **kw), H, D_MODEL).double()
    # Non-zero init for the zero-initialised parts so their gradients and effects are exercised.
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "pos_emb" in name or "rem_vector" in name:
                p.normal_(0, 0.5)
    fast = copy.deepcopy(ref)
    fast.cfg = copy.replace(ref.cfg, backend=backend) if hasattr(copy, "replace") else AttentionConfig(
        **{**ref.cfg.__dict__, "backend": backend})
    return ref, fast


def backends_for(method):
    a = Attention(AttentionConfig(method=method), H, D_MODEL)
    return [b for b in ("chunked", "sdpa", "flex") if unsupported_reason(b, a.parts, torch.device("cpu")) is None]


CASES = [(m, b) for m in METHODS for b in backends_for(m)]


@pytest.mark.parametrize("method,backend", CASES)
@pytest.mark.parametrize("T", [1, 63, 111])
def test_backend_matches_dense_reference(method, backend, T):
    ref, fast = make_pair(method, backend, chunk_size=16)
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64, requires_grad=backend != "flex")
    x2 = x.detach().clone().requires_grad_(x.requires_grad)
    with torch.set_grad_enabled(backend != "flex"):
        y_ref, y = ref(x), fast(x2)
    assert_close(y, y_ref, 1e-9, f"{method}/{backend} forward")
    if backend == "flex":
        return  # FlexAttention has no CPU backward; its gradients are checked by the gpu tests
    g = torch.randn_like(y_ref)
    y_ref.backward(g)
    y.backward(g)
    assert_close(x2.grad, x.grad, 1e-9, f"{method}/{backend} dx")
    for (name, p_ref), (_, p) in zip(ref.named_parameters(), fast.named_parameters()):
        if p_ref.grad is None:
            assert p.grad is None or p.grad.abs().max() == 0, name
            continue
        assert_close(p.grad, p_ref.grad, 1e-8, f"{method}/{backend} d{name}")


@pytest.mark.parametrize("method", ["dapev2-kerple", "stickbreaking", "cope", "xl", "dape-fire", "t5"])
def test_chunked_at_256(method):
    ref, fast = make_pair(method, "chunked", chunk_size=48)
    x = torch.randn(1, 256, D_MODEL, dtype=torch.float64)
    assert_close(fast(x), ref(x), 1e-9, method)


def causal_gap(module, T=40, t=17):
    x = torch.randn(2, T, D_MODEL, dtype=torch.float64)
    x2 = x.clone()
    x2[:, t + 1:] = torch.randn_like(x2[:, t + 1:])
    with torch.no_grad():
        return float((module(x)[:, : t + 1] - module(x2)[:, : t + 1]).abs().max())


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_causal(method, backend):
    m = Attention(AttentionConfig(method=method, backend=backend, chunk_size=8), H, D_MODEL).double()
    assert causal_gap(m) == 0.0


@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("method", ["dapev2-kerple", "dapev2-nope", "dapev2-rope", "dapev2-fire"])
def test_dapev2_causal_any_kernel(method, k):
    for backend in ("dense", "chunked"):
        m = Attention(AttentionConfig(method=method, dape_kernel=k, backend=backend, chunk_size=8), H, D_MODEL).double()
        assert causal_gap(m) == 0.0, (method, k, backend)


@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_leak_option_breaks_causality(backend):
    m = Attention(AttentionConfig(method="dapev2-kerple", dape_leak=True, backend=backend, chunk_size=8), H, D_MODEL).double()
    assert causal_gap(m) > 1e-6


def test_leak_is_off_by_default():
    assert AttentionConfig().dape_leak is False
    assert DapeV2(4).leak is False


# --- DAPE V2 against an independent nn.Conv2d computation ---------------------------------------

@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_dapev2_matches_conv2d_modules(with_bias, k):
    Hh, Dh, T = 5, 7, 13
    proc = DapeV2(Hh, hidden=Dh, kernel_size=k, with_bias=with_bias).double()
    c_in = 2 * Hh if with_bias else Hh
    conv1 = nn.Conv2d(c_in, Dh, (1, k), padding=(0, k // 2)).double()
    conv2 = nn.Conv2d(Dh, Hh, (1, k), padding=(0, k // 2)).double()
    conv1.load_state_dict({"weight": proc.conv1.weight, "bias": proc.conv1.bias})
    conv2.load_state_dict({"weight": proc.conv2.weight, "bias": proc.conv2.bias})
    assert proc.conv1.weight.shape == (Dh, c_in, 1, k) and proc.conv2.weight.shape == (Hh, Dh, 1, k)
    S = torch.randn(2, Hh, T, T, dtype=torch.float64)
    bias = torch.randn(Hh, T, T, dtype=torch.float64) if with_bias else None
    x = S if bias is None else torch.cat([S, bias.expand(2, -1, -1, -1)], 1)
    x = x * torch.tril(torch.ones(T, T, dtype=torch.float64))  # zero (not -inf) above the diagonal
    expected = S + (0 if bias is None else bias) + conv2(nn.functional.leaky_relu(conv1(x), 0.01))
    assert_close(proc(S, bias), expected, 1e-12)


def test_dapev2_rejects_wrong_bias_use():
    with pytest.raises(ValueError, match="with_bias=True"):
        DapeV2(4, with_bias=True)(torch.randn(1, 4, 5, 5))
    with pytest.raises(ValueError, match="with_bias=False"):
        DapeV2(4, with_bias=False)(torch.randn(1, 4, 5, 5), torch.randn(4, 5, 5))
    with pytest.raises(ValueError, match="odd"):
        DapeV2(4, kernel_size=2)


def test_dapev2_channel_counts_follow_the_base():
    with_bias = Attention(AttentionConfig(method="dapev2-kerple"), 4, 32).processor
    without = Attention(AttentionConfig(method="dapev2-rope"), 4, 32).processor
    v1 = Attention(AttentionConfig(method="dape-alibi"), 4, 32).processor
    assert with_bias.conv1.weight.shape == (32, 8, 1, 3)
    assert without.conv1.weight.shape == (32, 4, 1, 3)
    assert v1.conv1.weight.shape == (32, 8, 1, 1)


# --- the position parts ---------------------------------------------------------------------------

def test_alibi_slopes_non_power_of_two():
    expected = [2 ** -i for i in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]
    assert torch.allclose(alibi_slopes(12), torch.tensor(expected))
    assert torch.allclose(alibi_slopes(8), torch.tensor([2 ** -i for i in range(1, 9)], dtype=torch.float32))


def test_t5_buckets():
    n = torch.arange(0, 300)
    b = t5_bucket(n, 32, 128)
    assert b[:16].tolist() == list(range(16))
    assert b.max() == 31 and int(b[128]) == 31 and int(b[299]) == 31
    assert int(b[16]) == 16 and bool((b.diff() >= 0).all())
    expected = [16 + int(math.floor(math.log(k / 16) / math.log(8) * 16)) for k in range(16, 128)]
    assert b[16:128].tolist() == [min(e, 31) for e in expected]


def test_t5_is_shared_by_layers():
    from lenx.config import LMConfig
    from lenx.model import LM

    lm = LM(LMConfig(method="t5", n_layer=3))
    tables = {id(b.attn.bias) for b in lm.blocks}
    assert len(tables) == 1 and isinstance(lm.blocks[0].attn.bias, T5Bias)


def test_kerple_clamps_and_no_nan_gradients():
    for method in ("kerple", "kerple-power"):
        m = Attention(AttentionConfig(method=method), 4, 32)
        with torch.no_grad():
            for p in m.bias.parameters():
                p.fill_(-1.0)  # below the clamps
        y = m(torch.randn(1, 20, 32))
        y.sum().backward()
        for p in m.parameters():
            assert p.grad is None or torch.isfinite(p.grad).all()


# --- names, planner, errors -----------------------------------------------------------------------

def test_method_names_compose():
    for name in ["nope", "rope", "alibi", "kerple", "kerple-power", "fire", "t5", "cope", "xl", "dape-kerple",
                 "dapev2-kerple", "dapev2-rope", "dapev2-nope", "dapev2-alibi", "dapev2-fire", "dapev2-t5",
                 "stickbreaking"]:
        assert name in METHODS
        assert parse_method(name).name == name


def test_unknown_method_lists_valid_names():
    with pytest.raises(UnknownMethodError, match="kerple"):
        parse_method("kerpel")
    with pytest.raises(UnknownMethodError, match="cope is itself a score processor"):
        parse_method("dapev2-cope")


def test_forcing_an_unsupported_backend_is_an_error():
    with pytest.raises(ValueError, match="fused SDPA takes only"):
        Attention(AttentionConfig(method="kerple", backend="sdpa"), 4, 32)
    with pytest.raises(ValueError, match="FlexAttention"):
        Attention(AttentionConfig(method="dapev2-kerple", backend="flex"), 4, 32)


def test_planner_choices_on_cpu():
    cpu = torch.device("cpu")
    assert Attention(AttentionConfig(method="rope"), 4, 32).backend_for(cpu) == "sdpa"
    assert Attention(AttentionConfig(method="dapev2-kerple"), 4, 32).backend_for(cpu) == "chunked"
    assert Attention(AttentionConfig(method="kerple"), 4, 32).backend_for(cpu) == "chunked"


def test_non_causal_errors_for_directional_methods():
    for method in ("stickbreaking", "cope"):
        with pytest.raises(ValueError, match="non-causally"):
            Attention(AttentionConfig(method=method, causal=False), 4, 32)


def test_planner_keeps_small_heads_off_compiled_flex():
    """CUDA FlexAttention cannot compile head dims < 16 (found on the H200 with the CHE encoder,
    d 64 / 8 heads): the planner must route those to chunked, not fail inside inductor."""
    cuda = torch.device("cuda")
    small = Attention(AttentionConfig(method="kerple", causal=False), 8, 64)
    assert small.parts.head_dim == 8
    assert "at least 16" in unsupported_reason("flex", small.parts, cuda)
    assert small.backend_for(cuda) == "chunked"
    wide = Attention(AttentionConfig(method="kerple", causal=False), 4, 64)
    assert unsupported_reason("flex", wide.parts, cuda) is None
