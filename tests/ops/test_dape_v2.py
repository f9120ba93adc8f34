"""lenx.ops.dape_v2: the reference against independent nn.Conv2d modules and a row-by-row softmax,
and the fused kernels (triton.py) against the reference, the output and every gradient (q, k, v,
the bias table, both convs' weights and biases). Without CUDA the kernels run under Triton's
interpreter at small sizes; the gpu tests add long sequences in bf16."""

import math

import pytest
import torch
from torch import nn

from helpers import assert_close, rel_err
from kernel_cases import (CUDA, DEVICE, GPU_T, batch_for, bias_table, causal_gap, compare, fp32_copy, leaf,
                          log_errors, one_key_floors, tolerance)
from lenx.ops.biased_softmax.reference import table_bias
from lenx.ops.dape_v2.reference import dape_v2_reference, dape_v2_scores, dape_v2_scores_tabled, dape_v2_tables


def conv_weights(H, D, k, with_bias, dtype=torch.float64):
    torch.manual_seed(3)
    C = 2 * H if with_bias else H
    return (torch.randn(D, C, 1, k, dtype=dtype) * 0.3, torch.randn(D, dtype=dtype) * 0.1,
            torch.randn(H, D, 1, k, dtype=dtype) * 0.3, torch.randn(H, dtype=dtype) * 0.1)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_scores_match_conv2d_modules(with_bias, k):
    H, D, T = 5, 7, 13
    w1, b1, w2, b2 = conv_weights(H, D, k, with_bias)
    conv1 = nn.Conv2d(w1.shape[1], D, (1, k), padding=(0, k // 2)).double()
    conv2 = nn.Conv2d(D, H, (1, k), padding=(0, k // 2)).double()
    conv1.load_state_dict({"weight": w1, "bias": b1})
    conv2.load_state_dict({"weight": w2, "bias": b2})
    S = torch.randn(2, H, T, T, dtype=torch.float64)
    bias = torch.randn(H, T, T, dtype=torch.float64) if with_bias else None
    x = S if bias is None else torch.cat([S, bias.expand(2, -1, -1, -1)], 1)
    x = x * torch.tril(torch.ones(T, T, dtype=torch.float64))  # zero (not -inf) above the diagonal
    expected = S + (0 if bias is None else bias) + conv2(nn.functional.leaky_relu(conv1(x), 0.01))
    assert_close(dape_v2_scores(S, bias, w1, b1, w2, b2), expected, 1e-12)
    # a block of rows 4..9 sees the same scores as those rows of the whole map
    pos = torch.arange(T)
    block = dape_v2_scores(S[:, :, 4:10], None if bias is None else bias[:, 4:10], w1, b1, w2, b2, pos[4:10], pos)
    assert_close(block, expected[:, :, 4:10], 1e-12)


@pytest.mark.parametrize("k", [1, 3, 5, 7])
@pytest.mark.parametrize("T", [1, 2, 6, 17])
def test_tables_give_the_same_causal_scores(k, T):
    """Rewrite A: conv1 over the bias channels as the tables t1 (with the key-0 correction k0) and
    t2, on the whole map and on row blocks cut at their causal edge plus the halo."""
    H, D = 3, 4
    w1, b1, w2, b2 = conv_weights(H, D, k, True)
    table = torch.randn(H, 2 * T - 1, dtype=torch.float64)
    S = torch.randn(2, H, T, T, dtype=torch.float64)
    pos = torch.arange(T)
    causal = pos[None, :] <= pos[:, None]
    expected = dape_v2_scores(S, table_bias(table, pos, pos), w1, b1, w2, b2, pos, pos)
    t1, k0, t2 = dape_v2_tables(w1, b1, b2, table, T)
    assert t1.shape == (D, 2 * T - 1) and k0.shape == (k // 2, D, T) and t2.shape == (H, 2 * T - 1)
    got = dape_v2_scores_tabled(S, w1[:, :H], t1, k0, w2, t2, pos, pos)
    assert_close(got[..., causal], expected[..., causal], 1e-12)
    for q0 in range(0, T, 4):
        q1, Tk = min(T, q0 + 4), min(T, q0 + 4 + k // 2)
        block = dape_v2_scores_tabled(S[:, :, q0:q1, :Tk], w1[:, :H], t1, k0, w2, t2, pos[q0:q1], pos[:Tk])
        assert_close(block[..., causal[q0:q1, :Tk]], expected[:, :, q0:q1, :Tk][..., causal[q0:q1, :Tk]], 1e-12)


def test_reference_matches_rowwise_softmax():
    B, H, T, d, D, k = 1, 2, 9, 8, 3, 3
    q, kk, v = (torch.randn(B, H, T, d, dtype=torch.float64) for _ in range(3))
    table = torch.randn(H, 2 * T - 1, dtype=torch.float64)
    w = conv_weights(H, D, k, True)
    out = dape_v2_reference(q, kk, v, *w, table)
    pos = torch.arange(T)
    A = dape_v2_scores(q @ kk.transpose(-1, -2) / math.sqrt(d), table_bias(table, pos, pos), *w)
    for h in range(H):
        for i in range(T):
            expected = (A[0, h, i, : i + 1].softmax(0)[:, None] * v[0, h, : i + 1]).sum(0)
            assert torch.allclose(out[0, h, i], expected, atol=1e-12)


pytest.importorskip("triton")
from lenx.ops.dape_v2 import triton as kernel  # noqa: E402


def run_dape(B, H, T, d, ks, D, kind, dtype, conv_precision="bf16", config=None, op=None):
    """The fused kernel (or `op`: (q, k, v, w1, b1, w2, b2, table) -> out) against the fp32 dense
    reference: the output and every gradient."""
    from lenx.attention import DapeV2, Softmax
    from lenx.attention.backends import Parts, dense_attention

    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    tab = bias_table(kind, H, T)
    proc = DapeV2(H, D, ks, with_bias=tab is not None).to(DEVICE)
    params = list(proc.parameters())  # conv1.weight, conv1.bias, conv2.weight, conv2.bias
    do = torch.randn(B, H, T, d, device=DEVICE)
    extra = [tab] if tab is not None else []
    if op is None:
        out = kernel.dape_v2_triton(q, k, v, *params, tab, conv_precision, config=config)
    else:
        out = op(q, k, v, *params, tab)
    grads = torch.autograd.grad(out, [q, k, v] + extra + params, do.to(dtype))
    refs = [fp32_copy(x) for x in (q, k, v)]
    ref = dape_v2_reference(*refs, *params, tab)
    ref_grads = torch.autograd.grad(ref, refs + extra + params, do)
    names = ["out", "dq", "dk", "dv"] + (["dtable"] if extra else []) + ["dw1", "db1", "dw2", "db2"]
    # The conv2 bias adds a per-(row, head) constant, which the softmax ignores: its exact
    # gradient is 0, so its error is measured against the conv2 weight gradient's size.
    floors = {"db2": ref_grads[-2].norm().item()}
    if T == 1:
        floors = one_key_floors(names, ref_grads[2])
    tol = tolerance(dtype)
    if dtype != torch.float32:
        # conv1's weight and bias gradients are sums over all (i, j) pairs of terms that largely
        # cancel (each softmax row's gradient sums to zero), so any bf16 computation of them has a
        # relative error of several 1e-2. Hold the kernel to the same bar as eager PyTorch in
        # bf16 (the dense attention path under autocast): within 1.5x of its error, or 1e-2.
        def bias_part(q_pos, k_pos, q=None, k=None):
            return table_bias(tab, q_pos, k_pos)

        parts = Parts(bias_part if tab is not None else None, proc, Softmax())
        with torch.autocast(DEVICE.type, dtype=dtype):
            base, _ = dense_attention(q, k, v, parts)
        base_grads = torch.autograd.grad(base, [q, k, v] + extra + params, do.to(dtype))
        base_errs = [rel_err(a, b, floors.get(n, 1e-6)) for n, a, b in zip(names, [base, *base_grads], [ref, *ref_grads])]
        tol = {n: max(tol, 1.5 * e) for n, e in zip(names, base_errs)}
        log_errors({"case": f"bf16 eager baseline of {B} {H} {T} {d} {ks} {D} {kind}",
                    "errors": dict(zip(names, base_errs))})
    what = f"dapev2 B{B} H{H} T{T} d{d} k{ks} D{D} {kind} {dtype} " + (f"conv={conv_precision}" if op is None else
                                                                     getattr(op, "__name__", "op"))
    compare(what, [out, *grads], [ref, *ref_grads], names, tol, floors)


@pytest.mark.parametrize("T,ks,kind", [(1, 3, "kerple"), (17, 1, None), (40, 3, "kerple"), (29, 5, "alibi"),
                                       (33, 7, None)])
def test_dape_small(T, ks, kind):
    run_dape(2, 2, T, 16, ks, 4, kind, torch.float32)


def test_dape_small_two_pass_dkdv():
    """The dK/dV split into a dV pass and a dK pass (used for wide windows on the GPU)."""
    run_dape(1, 2, 40, 16, 3, 4, "t5", torch.float32, config={"split_dkdv": True})


def test_dape_small_wide_window_k3():
    """k = 3 with 32-key windows (the bf16 default on the GPU; fp32 inputs use 16 otherwise)."""
    run_dape(1, 2, 70, 16, 3, 4, "kerple", torch.float32, config={"tiles": (16, 32, 8, 1)})


def test_dape_rejects_bad_arguments():
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    w = [x.to(DEVICE).float() for x in conv_weights(2, 4, 3, True)]
    tab = torch.zeros(2, 15, device=DEVICE)
    with pytest.raises(ValueError, match="do not fit"):
        kernel.dape_v2_triton(q, q, q, *w)  # 2H input channels but no table
    with pytest.raises(ValueError, match="H <= 32"):
        kernel.dape_v2_triton(q, q, q, *[x.to(DEVICE).float() for x in conv_weights(2, 4, 9, True)], tab)
    with pytest.raises(ValueError, match="unknown DAPE V2 launch settings"):
        kernel.dape_v2_triton(q, q, q, *w, tab, config={"tile": (16, 32, 8, 1)})


def test_causal():
    T, t = (40, 17) if not CUDA else (300, 150)
    tab = bias_table("kerple", 2, T)
    w = [x.to(DEVICE).float() for x in conv_weights(2, 4, 3, True)]
    assert causal_gap(lambda q, k, v: (kernel.dape_v2_triton(q, k, v, *w, tab),), T, t) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("T", GPU_T)
def test_gpu_dape_kerple(T):
    """The paper's headline setting: H = 12, d = 64, k = 3, D = 32, Kerple."""
    run_dape(batch_for(T), 12, T, 64, 3, 32, "kerple", torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("T,H,d,ks,D,kind", [
    (1000, 4, 32, 5, 16, None),  # dapev2-rope / -nope: no bias channels
    (128, 2, 64, 7, 8, "alibi"),  # widest kernel: 32-key windows, split dK/dV passes
    (1000, 3, 32, 1, 8, "t5"),  # DAPE v1 (k = 1)
    (1000, 16, 64, 3, 64, "kerple"),  # the 350M model's heads, widest hidden
    (17, 16, 64, 5, 32, "kerple"),  # tables with a 2-key correction at key 0, short
    (1000, 12, 64, 7, 32, "kerple"),  # 3-key correction, 12 heads
    (4096, 8, 64, 5, 16, "alibi"),
    (128, 12, 32, 1, 64, "alibi"),  # k = 1: tables, no correction
])
def test_gpu_dape_shapes(T, H, d, ks, D, kind):
    run_dape(2, H, T, d, ks, D, kind, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_dape_tf32_conv():
    run_dape(2, 12, 1000, 64, 3, 32, "kerple", torch.bfloat16, conv_precision="tf32")


@pytest.mark.gpu
def test_gpu_dape_fp32():
    run_dape(2, 2, 300, 32, 3, 4, "kerple", torch.float32)
