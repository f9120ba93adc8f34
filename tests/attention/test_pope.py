"""PoPE (lenx.attention.pope): a float64 reference in complex numbers, written from the paper's formula,
against the dense, chunked and SDPA paths (forward and backward, T = 1, 63, 111); its phase bias
(zero at first, clamped to [-2 pi, 0]); relative positions only; causality; the cache's width; the
fused kernels and RoPE's context extensions refused in one line. Decoding = full forward for pope,
dape-pope, dapev2-pope and their stick-breaking forms is tests/model/test_decode.py's (every method)."""

import math

import pytest
import torch
from torch.nn import functional as F

from helpers import V, assert_close, model_for
from lenx.attention import Attention, AttentionConfig
from lenx.attention.backends import run_backend, unsupported_reason
from lenx.attention.backends.fused import Fused
from lenx.config import ConfigError, load_config
from lenx.model import check_config


def polar_scores(q, k, delta, pos_q, pos_k, base=10000.0):
    """Re sum_c q~_c conj(k~_c) / sqrt(d): q~ = softplus(q) e^{i p theta}, k~ = softplus(k) e^{i (p theta + delta)},
    theta_c = base^(-c/d) for c = 0 .. d - 1 (rounded to float32, as lenx keeps RoPE's and PoPE's
    frequencies), delta clamped to [-2 pi, 0] (complex128)."""
    d = q.shape[-1]
    theta = (base ** (-torch.arange(d, dtype=torch.float64) / d)).float().double()
    delta = delta.clamp(-2 * math.pi, 0)[:, None, :]  # [H, 1, d]
    qc = F.softplus(q) * torch.exp(1j * pos_q.double()[:, None] * theta)
    kc = F.softplus(k) * torch.exp(1j * (pos_k.double()[:, None] * theta + delta))
    return (qc @ kc.conj().transpose(-1, -2)).real / math.sqrt(d)


def reference(attn, x):
    B, T, C = x.shape
    H, d = attn.n_head, attn.head_dim
    q, k, v = attn.qkv(x).view(B, T, 3, H, d).permute(2, 0, 3, 1, 4)
    pos = torch.arange(T)
    scores = polar_scores(q, k, attn.rope.phase_bias, pos, pos)
    if attn.processor is not None:
        scores = attn.processor(scores, None, None, pos, pos)
    out = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1) @ v
    return attn.proj(out.transpose(1, 2).reshape(B, T, C))


def module(method, **settings):
    torch.manual_seed(0)
    attn = Attention(AttentionConfig(method=method, chunk_size=16, dape_hidden=4, **settings), 2, 16).double()
    with torch.no_grad():  # a phase bias inside its range, and other parts off their initial values
        for name, p in attn.named_parameters():
            if name == "rope.phase_bias":
                p.uniform_(-2 * math.pi, 0)
            elif not name.startswith(("qkv", "proj")):
                p.add_(0.2 * torch.randn_like(p))
    return attn


def through(attn, x, backend):
    B, T, C = x.shape
    q, k, v = attn.project(x)
    out, rem = run_backend(backend, q, k, v, attn.parts, attn.cfg.chunk_size)
    return attn.proj(attn.normaliser.finish(out, rem, v).transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("method", ["pope", "dapev2-pope", "dape-pope"])
@pytest.mark.parametrize("T", [1, 63, 111])
def test_every_path_is_the_complex_reference_forward_and_backward(method, T):
    attn = module(method)
    x = torch.randn(2, T, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, T, 16, dtype=torch.float64)
    inputs = [x] + list(attn.parameters())
    want = reference(attn, x)
    want_grads = torch.autograd.grad((want * w).sum(), inputs)
    cpu = torch.device("cpu")
    backends = [b for b in ("dense", "chunked", "sdpa") if unsupported_reason(b, attn.parts, cpu) is None]
    assert ("sdpa" in backends) == (method == "pope")
    for backend in backends:
        got = through(attn, x, backend)
        assert_close(got, want, 1e-12, f"{method} {backend} T={T}")
        got_grads = torch.autograd.grad((got * w).sum(), inputs)
        for (name, _), a, b in zip([("x", x)] + list(attn.named_parameters()), got_grads, want_grads):
            assert_close(a, b, 1e-10, f"{method} {backend} T={T} gradient of {name}", floor=1e-3)
    assert_close(attn(x), want, 1e-12, f"{method} planned backend")


def test_stick_breaking_on_pope_is_the_same_on_both_reference_paths():
    attn = module("stickbreaking-pope")
    x = torch.randn(2, 63, 16, dtype=torch.float64, requires_grad=True)
    dense, chunked = through(attn, x, "dense"), through(attn, x, "chunked")
    assert_close(chunked, dense, 1e-12, "stickbreaking-pope")
    g1, g2 = (torch.autograd.grad(y.sum(), [x, attn.rope.phase_bias]) for y in (dense, chunked))
    for a, b in zip(g1, g2):
        assert_close(a, b, 1e-10, "stickbreaking-pope gradient")


def test_the_phase_bias_starts_at_zero_and_stays_in_its_range():
    attn = Attention(AttentionConfig(method="pope"), 4, 64)
    assert attn.rope.phase_bias.shape == (4, 16) and not attn.rope.phase_bias.any()
    assert attn.key_dim == 32 and attn.head_dim == 16
    attn = module("pope")
    x = torch.randn(1, 20, 16, dtype=torch.float64)
    with torch.no_grad():
        attn.rope.phase_bias.fill_(0.0)
        at_zero = attn(x)
        attn.rope.phase_bias.fill_(1.5)  # above 0: clamped to 0
        assert torch.equal(attn(x), at_zero)
        attn.rope.phase_bias.fill_(-2 * math.pi)
        at_floor = attn(x)
        attn.rope.phase_bias.fill_(-9.0)  # below -2 pi: clamped to it
        assert torch.equal(attn(x), at_floor)


def test_scores_depend_on_relative_positions_only():
    attn = module("pope")
    q, k = torch.randn(2, 1, 2, 5, 8, dtype=torch.float64)
    pos = torch.arange(5)
    a = attn.rope(q, k, pos)
    b = attn.rope(q, k, pos + 1000)
    assert a[0].shape[-1] == 16
    assert torch.allclose(a[0] @ a[1].transpose(-1, -2), b[0] @ b[1].transpose(-1, -2), atol=1e-9)


def test_a_future_token_leaves_the_past_alone():
    model = model_for("pope")
    idx = torch.randint(0, V, (1, 40))
    changed = idx.clone()
    changed[0, 30] = (changed[0, 30] + 1) % V
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    assert torch.equal(a[:, :30], b[:, :30]) and not torch.allclose(a[:, 30], b[:, 30])


def test_the_cache_keeps_keys_at_their_width():
    model = model_for("dapev2-pope")
    cache = model.new_cache(2, 10)
    assert cache.layers[0].k.shape == (2, 2, 10, 16) and cache.layers[0].v.shape == (2, 2, 10, 8)


def test_under_bf16_autocast_it_trains():
    model = model_for("pope").float().train()
    idx = torch.randint(0, V, (2, 24))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert math.isfinite(loss.item()) and model.blocks[0].attn.rope.phase_bias.grad is not None


def test_the_fused_kernels_and_rope_s_extensions_are_refused_in_one_line():
    attn = Attention(AttentionConfig(method="stickbreaking-pope"), 4, 64)
    reason = Fused().unsupported(attn.parts, torch.device("cuda"))
    assert reason is not None and "\n" not in reason
    if "not installed" not in reason:
        assert "one width" in reason
    for scaling in ("pi", "yarn", "dynamic-ntk"):
        cfg = load_config("tiny", ["model.method=pope", f"model.rope_scaling={scaling}", "model.rope_train_len=64"])
        with pytest.raises(ConfigError, match="PoPE has its own and takes none") as e:
            check_config(cfg)
        assert "\n" not in str(e.value)
    from lenx.evaluation.evaluate import apply_rope_scaling

    with pytest.raises(ConfigError, match="has no RoPE"):
        apply_rope_scaling(load_config("tiny", ["model.method=pope"]), "yarn", None)
    with pytest.raises(ConfigError, match="pope_base"):
        check_config(load_config("tiny", ["model.method=pope", "model.pope_base=1"]))
