"""FoX (arXiv 2503.02130) against float64 references written from the paper's formula: the logits
s_ij = q_i . k_j / sqrt(d) + sum_{l=j+1..i} log sigmoid(w_f . x_l + b_f) by a double loop over (i, j),
forward and backward, on the dense and chunked paths at odd sizes; the gradient to w_f and b_f by
gradcheck; the Pro block's options, each against its own formula; causality; the planner's route;
what is refused."""

import importlib.util
import math

import pytest
import torch
from torch.nn import functional as F

from helpers import V, assert_close, model_for
from lenx.attention import Attention, AttentionConfig, all_methods, parse_method
from lenx.attention.backends import plan_backend
from lenx.attention.backends.base import Work
from lenx.attention.backends.reference import Chunked
from lenx.attention.fox import ForgetGate
from lenx.che.protocol import runs_causally

FOX_METHODS = ["fox", "dape-fox", "dapev2-fox", "stickbreaking-fox", "dape-stickbreaking-fox",
               "dapev2-stickbreaking-fox"]
PRO = ["fox_output_gate", "fox_qk_norm", "fox_kv_shift", "fox_output_norm"]


def attention(method="fox", backend="dense", chunk_size=16, **switches):
    """A float64 FoX attention layer (C 12, 3 heads of 4), its parameters moved off their initial values."""
    torch.manual_seed(0)
    cfg = AttentionConfig(method=method, backend=backend, chunk_size=chunk_size, dape_hidden=4, **switches)
    attn = Attention(cfg, 3, 12).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return attn


def fox_loop(x, attn):
    """The layer's output by the paper's definition, with each option of the Pro block written out:
    a double loop over (i, j) for the logits, the sum of log f over l = j+1..i taken per entry."""
    B, T, C = x.shape
    H = attn.n_head
    d = C // H
    q, k, v = (t.view(B, T, H, d).transpose(1, 2) for t in (x @ attn.qkv.weight.T).split(C, -1))
    pro = attn.pro
    if pro is not None and pro.shift is not None:  # k_t <- a_t k_{t-1} + (1 - a_t) k_t, k_{-1} = 0
        a = torch.sigmoid(x @ pro.shift.weight.T)  # [B, T, 2H]
        shifted = []
        for t_in, a_h in ((k, a[..., :H]), (v, a[..., H:])):
            out = torch.empty_like(t_in)
            for t in range(T):
                prev = t_in[:, :, t - 1] if t > 0 else torch.zeros_like(t_in[:, :, 0])
                w = a_h[:, t, :, None]
                out[:, :, t] = w * prev + (1 - w) * t_in[:, :, t]
            shifted.append(out)
        k, v = shifted
    if pro is not None and pro.q_scale is not None:
        q = q / torch.sqrt((q * q).mean(-1, keepdim=True) + 1e-5) * pro.q_scale[:, None]
        k = k / torch.sqrt((k * k).mean(-1, keepdim=True) + 1e-5) * pro.k_scale[:, None]
    gate = attn.bias.proj
    log_f = F.logsigmoid(x @ gate.weight.T + gate.bias).transpose(1, 2)  # [B, H, T]
    s = torch.full((B, H, T, T), float("-inf"), dtype=x.dtype)
    for i in range(T):
        for j in range(i + 1):
            s[:, :, i, j] = (q[:, :, i] * k[:, :, j]).sum(-1) / math.sqrt(d) + log_f[:, :, j + 1:i + 1].sum(-1)
    o = torch.softmax(s, -1) @ v
    if pro is not None and pro.out_scale is not None:
        o = o / torch.sqrt((o * o).mean(-1, keepdim=True) + 1e-6) * pro.out_scale[:, None]
    o = o.transpose(1, 2).reshape(B, T, C)
    if pro is not None and pro.out_gate is not None:
        o = o * torch.sigmoid(x @ pro.out_gate.weight.T)
    return o @ attn.proj.weight.T


@pytest.mark.parametrize("T", [1, 63, 111])
@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_the_paths_follow_the_paper_forward_and_backward(T, backend):
    attn = attention(backend=backend)
    x = torch.randn(2, T, 12, dtype=torch.float64, requires_grad=True)
    got, want = attn(x), fox_loop(x, attn)
    assert_close(got, want, 1e-10, f"{backend} T {T}")
    g = torch.randn_like(got)
    params = [x, attn.qkv.weight, attn.proj.weight, attn.bias.proj.weight, attn.bias.proj.bias]
    for a, b, name in zip(torch.autograd.grad(got, params, g), torch.autograd.grad(want, params, g),
                          ["x", "qkv", "proj", "w_f", "b_f"]):
        assert_close(a, b, 1e-9, f"{backend} T {T}: d{name}")


@pytest.mark.parametrize("switch", PRO)
def test_each_pro_option_follows_its_formula(switch):
    attn = attention(backend="chunked", **{switch: True})
    x = torch.randn(2, 37, 12, dtype=torch.float64, requires_grad=True)
    got, want = attn(x), fox_loop(x, attn)
    assert_close(got, want, 1e-10, switch)
    params = [x] + [p for p in attn.pro.parameters()]
    for a, b in zip(torch.autograd.grad(got.sum(), params), torch.autograd.grad(want.sum(), params)):
        assert_close(a, b, 1e-9, f"{switch}: gradients")
    assert not torch.allclose(got, attention(backend="chunked")(x)), f"{switch} changes nothing"


def test_all_pro_options_together_on_both_paths():
    x = torch.randn(1, 63, 12, dtype=torch.float64)
    switches = dict.fromkeys(PRO, True)
    for backend in ("dense", "chunked"):
        attn = attention(backend=backend, **switches)
        assert_close(attn(x), fox_loop(x, attn), 1e-10, backend)


@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_gradcheck_of_the_forget_gate(backend):
    """The gradient to w_f and b_f, by finite differences (float64, tiny)."""
    attn = attention(backend=backend, chunk_size=2)
    x = torch.randn(1, 5, 12, dtype=torch.float64)
    gate = attn.bias.proj
    w0, b0 = gate.weight.detach().clone(), gate.bias.detach().clone()

    def f(w, b):
        with torch.nn.utils.stateless._reparametrize_module(attn, {"bias.proj.weight": w, "bias.proj.bias": b}):
            return attn(x)

    assert torch.autograd.gradcheck(f, (w0.requires_grad_(), b0.requires_grad_()))


@pytest.mark.parametrize("method", FOX_METHODS)
def test_compositions_are_causal_and_match_dense(method):
    """Changing a future token leaves every earlier output alone; chunked == dense, forward and
    backward (the DAPE processors and stick-breaking read the forget bias like any other)."""
    dense, chunked = attention(method, "dense"), attention(method, "chunked", chunk_size=8)
    x = torch.randn(2, 31, 12, dtype=torch.float64, requires_grad=True)
    out = dense(x)
    assert_close(chunked(x), out, 1e-10, method)
    gd = torch.autograd.grad(dense(x).square().sum(), [x, dense.bias.proj.weight])
    gc = torch.autograd.grad(chunked(x).square().sum(), [x, chunked.bias.proj.weight])
    for a, b in zip(gc, gd):
        assert_close(a, b, 1e-9, f"{method}: gradients")
    y = x.detach().clone()
    y[:, 20] += 1.0
    with torch.no_grad():
        changed = dense(y)
    assert torch.equal(changed[:, :20], out[:, :20].detach()), method
    assert not torch.allclose(changed[:, 20:], out[:, 20:].detach())


def test_a_model_with_every_option_is_causal():
    model = model_for("dapev2-fox", **dict.fromkeys(PRO, True))
    idx = torch.randint(0, V, (2, 24))
    other = idx.clone()
    other[:, 15] = (other[:, 15] + 1) % V
    with torch.no_grad():
        a, b = model(idx)[0], model(other)[0]
    assert torch.equal(a[:, :15], b[:, :15]) and not torch.allclose(a[:, 15:], b[:, 15:])


def test_initialisation_follows_the_authors_code():
    """w_f ~ N(0, 0.02), b_f = 0 (forgetting-transformer 883f260, fgate_type "full"); the shift and
    output gate weights N(0, 0.02), no bias; the QK-norm and output norm scales ones."""
    torch.manual_seed(0)
    attn = Attention(AttentionConfig(method="fox", **dict.fromkeys(PRO, True)), 8, 512)
    assert torch.equal(attn.bias.proj.bias, torch.zeros(8))
    for w in (attn.bias.proj.weight, attn.pro.shift.weight, attn.pro.out_gate.weight):
        assert abs(w.std().item() - 0.02) < 0.002 and abs(w.mean().item()) < 0.002
    assert attn.pro.shift.bias is None and attn.pro.out_gate.bias is None
    for scale in (attn.pro.q_scale, attn.pro.k_scale, attn.pro.out_scale):
        assert torch.equal(scale, torch.ones(8, 64))
    assert Attention(AttentionConfig(method="fox"), 2, 8).pro is None  # every option off by default


def test_the_names_and_what_runs_them():
    assert {"fox", "dape-fox", "dapev2-fox", "stickbreaking-fox"} <= set(all_methods())
    assert parse_method("fox").causal_only and runs_causally("dapev2-fox")  # CHE runs FoX causally
    attn = Attention(AttentionConfig(method="fox"), 2, 32)  # head dim 16: one the fused kernels take
    assert plan_backend(attn.parts, torch.device("cpu")) == "chunked"
    fused = "triton" if importlib.util.find_spec("triton") else "chunked"
    assert plan_backend(attn.parts, torch.device("cuda")) == fused  # lenx.ops.forgetting
    for backend in ("sdpa", "flex"):
        with pytest.raises(ValueError, match="cannot run this attention"):
            plan_backend(attn.parts, torch.device("cuda"), backend)


@pytest.mark.parametrize("method,reason", [("dapev2-fox", "takes no score processor"),
                                           ("dape-fox", "takes no score processor"),
                                           ("stickbreaking-fox", "takes no position bias")])
def test_compositions_stay_on_chunked(method, reason):
    """The fused FoX kernel is plain causal softmax plus c_i - c_j: a processor or stick-breaking
    over FoX runs on the chunked reference, and asking for triton says why."""
    pytest.importorskip("triton")
    attn = Attention(AttentionConfig(method=method, dape_hidden=4), 2, 32)
    assert plan_backend(attn.parts, torch.device("cuda")) == "chunked"
    with pytest.raises(ValueError, match=reason):
        plan_backend(attn.parts, torch.device("cuda"), "triton")


def test_document_segments_on_the_fused_fox_kernel():
    """FoX's fused kernel takes document ids (the biased-softmax kernels' masks); DAPE V2 over FoX has
    no fused kernel, masked or not (the chunked reference)."""
    pytest.importorskip("triton")
    from dataclasses import replace

    parts = replace(Attention(AttentionConfig(method="fox"), 2, 32).parts, segments=True)
    assert plan_backend(parts, torch.device("cuda")) == "triton"
    dape = replace(Attention(AttentionConfig(method="dapev2-fox", dape_hidden=4), 2, 32).parts, segments=True)
    assert plan_backend(dape, torch.device("cuda")) == "chunked"


def test_the_memory_estimate_binds_the_gate():
    attn = Attention(AttentionConfig(method="dapev2-fox"), 2, 16)
    mem = Chunked().memory(attn.parts, Work(batch=2, heads=2, length=128, head_dim=8))
    assert mem.peak > 0


def test_what_is_refused():
    with pytest.raises(ValueError, match="causal by construction"):
        Attention(AttentionConfig(method="fox", causal=False), 2, 16)
    with pytest.raises(ValueError, match="need a fox method"):
        Attention(AttentionConfig(method="kerple", fox_qk_norm=True), 2, 16)
    gate = ForgetGate(16, 2)
    pos = torch.arange(4)
    with pytest.raises(RuntimeError, match="bind it"):
        gate(pos, pos)
    with pytest.raises(RuntimeError, match="bind it"):  # what the fused backend reads
        gate.token_values()


def test_the_profiler_ranges_change_nothing():
    """`lenx bench --train-step` marks the attention (profiling.marked) with the bound parts."""
    from lenx.attention.profiling import attention_ranges

    attn = attention(backend="chunked", fox_kv_shift=True)
    x = torch.randn(1, 9, 12, dtype=torch.float64, requires_grad=True)
    out = attn(x)
    grads = torch.autograd.grad(out.square().sum(), [x, *attn.parameters()])
    with attention_ranges():
        marked = attn(x)
        marked_grads = torch.autograd.grad(marked.square().sum(), [x, *attn.parameters()])
    torch.testing.assert_close(marked, out, rtol=0, atol=0)
    for a, b in zip(marked_grads, grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
