"""lenx.ops.biased_softmax: the reference against a direct computation, and the fused kernels
(triton.py) against the reference, the output and every gradient. Without CUDA the kernels run
under Triton's interpreter at small sizes; the gpu tests add long sequences in bf16."""

import math

import pytest
import torch

from kernel_cases import (CUDA, DEVICE, GPU_T, batch_for, bias_table, causal_gap, compare, fp32_copy, leaf,
                          one_key_floors, tolerance)
from lenx.ops.biased_softmax.reference import biased_softmax_reference, table_bias


def test_reference_matches_rowwise_softmax():
    """Each row on its own in float64: softmax over keys 0..i of q_i.k_j / sqrt(d) + table[h, i - j]."""
    B, H, T, d = 2, 3, 11, 8
    q, k, v = (torch.randn(B, H, T, d, dtype=torch.float64) for _ in range(3))
    table = torch.randn(H, 2 * T - 1, dtype=torch.float64)
    out = biased_softmax_reference(q, k, v, table)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                logits = torch.stack([q[b, h, i] @ k[b, h, j] / math.sqrt(d) + table[h, i - j + T - 1]
                                      for j in range(i + 1)])
                expected = (logits.softmax(0)[:, None] * v[b, h, : i + 1]).sum(0)
                assert torch.allclose(out[b, h, i], expected, atol=1e-12)
    assert torch.equal(table_bias(table, torch.tensor([4]), torch.tensor([1]))[:, 0, 0], table[:, 3 + T - 1])


pytest.importorskip("triton")
from lenx.ops.biased_softmax import triton as kernel  # noqa: E402


def run_biased(B, H, T, d, kind, dtype, tol=None, config=None):
    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    tab = bias_table(kind, H, T)
    do = torch.randn(B, H, T, d, device=DEVICE)
    leaves = [q, k, v] + ([tab] if tab is not None else [])
    out = kernel.biased_attention(q, k, v, tab, config=config)
    grads = torch.autograd.grad(out, leaves, do.to(dtype))
    refs = [fp32_copy(x) for x in (q, k, v)] + leaves[3:]
    ref = biased_softmax_reference(*refs[:3], tab)
    ref_grads = torch.autograd.grad(ref, refs, do)
    names = ["out", "dq", "dk", "dv", "dtable"][: 1 + len(leaves)]
    floors = one_key_floors(names, ref_grads[2]) if T == 1 else {}
    compare(f"biased B{B} H{H} T{T} d{d} {kind} {dtype}", [out, *grads], [ref, *ref_grads], names,
            tol or tolerance(dtype), floors)


def run_biased_kerple_params(B, H, T, d, dtype, kind="log"):
    """The Kerple mode: the bias's two parameters get their gradients from the kernel directly (no
    table gradient); one head's first parameter sits below its clamp, so its gradient must be
    exactly zero."""
    from lenx.attention import KerpleLog, KerplePower

    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    bias = (KerpleLog if kind == "log" else KerplePower)(H).to(DEVICE)
    params = [bias.r1, bias.r2] if kind == "log" else [bias.a, bias.p]
    with torch.no_grad():
        params[0][0] = 1e-3
    do = torch.randn(B, H, T, d, device=DEVICE)
    out = kernel.biased_attention(q, k, v, bias.table(T, DEVICE), **bias.fused_grad_args())
    grads = torch.autograd.grad(out, [q, k, v] + params, do.to(dtype))
    refs = [fp32_copy(x) for x in (q, k, v)]
    ref = biased_softmax_reference(*refs, bias.table(T, DEVICE))
    ref_grads = torch.autograd.grad(ref, refs + params, do)
    assert grads[3][0] == 0 and ref_grads[3][0] == 0
    names = ["out", "dq", "dk", "dv", "dx", "dy"]
    floors = one_key_floors(names, ref_grads[2]) if T == 1 else {}
    compare(f"biased kerple-{kind} params B{B} H{H} T{T} d{d} {dtype}", [out, *grads], [ref, *ref_grads], names,
            tolerance(dtype), floors)


def run_biased_t5_tail(B, H, T, d, dtype):
    """T5 with the constant-tail table gradient (key tiles beyond the last bucket's first distance
    add only their total): the embedding's gradient against the reference."""
    from lenx.attention import T5Bias

    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    bias = T5Bias(H).to(DEVICE)
    with torch.no_grad():
        bias.relative_attention_bias.weight.normal_()
    do = torch.randn(B, H, T, d, device=DEVICE)
    params = [bias.relative_attention_bias.weight]
    out = kernel.biased_attention(q, k, v, bias.table(T, DEVICE), **bias.fused_grad_args())
    grads = torch.autograd.grad(out, [q, k, v] + params, do.to(dtype))
    refs = [fp32_copy(x) for x in (q, k, v)]
    ref = biased_softmax_reference(*refs, bias.table(T, DEVICE))
    ref_grads = torch.autograd.grad(ref, refs + params, do)
    names = ["out", "dq", "dk", "dv", "dweight"]
    floors = one_key_floors(names, ref_grads[2]) if T == 1 else {}
    compare(f"biased t5 tail B{B} H{H} T{T} d{d} {dtype}", [out, *grads], [ref, *ref_grads], names,
            tolerance(dtype), floors)


# --- small sizes: the interpreter on CPU (and the compiled kernels on a GPU) ------------------

@pytest.mark.parametrize("T", [1, 17, 40])
@pytest.mark.parametrize("kind", ["kerple", None])
def test_biased_small(T, kind):
    run_biased(2, 2, T, 16, kind, torch.float32)


@pytest.mark.parametrize("T", [1, 17, 40])
@pytest.mark.parametrize("kind", ["log", "power"])
def test_biased_small_kerple_params(T, kind):
    run_biased_kerple_params(2, 3, T, 16, torch.float32, kind)


@pytest.mark.parametrize("T", [17, 200])
def test_biased_small_t5_tail(T):
    run_biased_t5_tail(1, 2, T, 16, torch.float32)


def test_biased_small_t5_alibi():
    run_biased(1, 3, 33, 32, "t5", torch.float32)
    run_biased(1, 2, 20, 16, "alibi", torch.float32)


@pytest.mark.parametrize("kind", ["kerple", "kerple-power", "alibi", "t5"])
def test_biased_small_fp16_band(kind):
    """The bias band as fp16 residuals against per-row fp32 offsets (the bf16/fp16 default) on
    the exact fp32 path, with larger tiles (several key tiles per query tile, padding rows): the
    residuals' rounding is the only error (measured <= 4e-4), so 2e-3."""
    config = {"band": ("fp16",), "fwd": (64, 32, 4, 1), "dq": (64, 32, 4, 1)}
    run_biased(1, 2, 130, 16, kind, torch.float32, tol=2e-3, config=config)


def test_biased_rejects_bad_arguments():
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    from lenx.attention import KerpleLog

    tab = KerpleLog(2).to(DEVICE).table(8, DEVICE)
    r = torch.ones(2, device=DEVICE)
    with pytest.raises(ValueError, match="kerple must be"):
        kernel.biased_attention(q, q, q, tab, ("cubic", r, r))
    with pytest.raises(ValueError, match="kerple must be"):
        kernel.biased_attention(q, q, q, None, ("log", r, r))
    with pytest.raises(ValueError, match="tail must be"):
        kernel.biased_attention(q, q, q, None, tail=113)
    with pytest.raises(ValueError, match="tail must be"):
        kernel.biased_attention(q, q, q, tab, ("log", r, r), tail=113)
    with pytest.raises(ValueError, match="bias table must be"):
        kernel.biased_attention(q, q, q, tab[:, :5])
    with pytest.raises(ValueError, match="head dims"):
        kernel.biased_attention(*(torch.randn(1, 2, 8, 12),) * 3)
    with pytest.raises(ValueError, match="unknown tile settings"):
        kernel.biased_attention(q, q, q, tab, config={"fwdd": (64, 64, 4, 3)})
    with pytest.raises(ValueError, match="key tiles must be"):
        kernel.biased_attention(q, q, q, tab, config={"fwd": (64, 128, 4, 3)})


def test_causal():
    T, t = (40, 17) if not CUDA else (300, 150)
    tab = bias_table("kerple", 2, T)
    assert causal_gap(lambda q, k, v: (kernel.biased_attention(q, k, v, tab),), T, t) < 1e-6


# --- long sequences in bf16 (and fp32 at small T): the compiled kernels on a GPU ---------------

@pytest.mark.gpu
@pytest.mark.parametrize("T", GPU_T)
def test_gpu_biased_kerple(T):
    run_biased(batch_for(T), 12, T, 64, "kerple", torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("T", GPU_T)
def test_gpu_biased_kerple_params(T):
    run_biased_kerple_params(batch_for(T), 12, T, 64, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [128, 1000, 4096])
def test_gpu_biased_t5_tail(T):
    run_biased_t5_tail(batch_for(T), 12, T, 64, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [128, 4096])
def test_gpu_biased_kerple_power_params(T):
    run_biased_kerple_params(batch_for(T), 12, T, 64, torch.bfloat16, "power")


@pytest.mark.gpu
@pytest.mark.parametrize("T,H,d,kind", [(1000, 4, 128, "alibi"), (1000, 3, 32, "t5"), (128, 2, 16, None)])
def test_gpu_biased_other(T, H, d, kind):
    run_biased(2, H, T, d, kind, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_biased_fp32():
    run_biased(2, 2, 300, 32, "kerple", torch.float32)
