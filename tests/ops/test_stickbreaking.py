"""lenx.ops.stickbreaking: the reference against the product of sticks, and the fused kernels
(triton.py) against the reference, the output, the remainder and every gradient. Without CUDA the
kernels run under Triton's interpreter at small sizes; the gpu tests add long sequences in bf16."""

import pytest
import torch

from helpers import assert_close, stick_loop
from kernel_cases import CUDA, DEVICE, GPU_T, batch_for, causal_gap, compare, fp32_copy, leaf, tolerance
from lenx.ops.stickbreaking.reference import stickbreaking_reference


@pytest.mark.parametrize("attend_current", [False, True])
def test_reference_matches_product_loop(attend_current):
    q, k, v = (torch.randn(1, 2, 19, 8, dtype=torch.float64) for _ in range(3))
    out, rem = stickbreaking_reference(q, k, v, attend_current)
    ref_out, ref_rem = stick_loop(q, k, v, attend_current)
    assert_close(out, ref_out, 1e-12)
    assert_close(rem, ref_rem, 1e-12)
    if not attend_current:  # position 0 has no key: output 0, the whole stick left
        assert out[..., 0, :].abs().max() == 0 and (rem[..., 0] == 1).all()


pytest.importorskip("triton")
from lenx.ops.stickbreaking import triton as kernel  # noqa: E402


def run_sb(B, H, T, d, attend_current, dtype, q_scale=1.0, config=None):
    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    if q_scale != 1.0:  # larger logits: the fp16 in-block scan rounds large softplus values
        q = (q.detach().float() * q_scale).to(dtype).requires_grad_()
    do = torch.randn(B, H, T, d, device=DEVICE)
    drem = torch.randn(B, H, T, device=DEVICE)
    out, rem = kernel.stickbreaking_triton(q, k, v, attend_current, config=config)
    assert out.dtype == dtype and rem.dtype == torch.float32
    grads = torch.autograd.grad((out, rem), (q, k, v), (do.to(dtype), drem))
    refs = [fp32_copy(x) for x in (q, k, v)]
    ref, ref_rem = stickbreaking_reference(*refs, attend_current)
    ref_grads = torch.autograd.grad((ref, ref_rem), refs, (do, drem))
    scaled = f" q x{q_scale:g}" if q_scale != 1.0 else ""
    compare(f"stickbreaking B{B} H{H} T{T} d{d} current={attend_current}{scaled} {dtype}", [out, rem, *grads],
            [ref, ref_rem, *ref_grads], ["out", "rem", "dq", "dk", "dv"], tolerance(dtype))


@pytest.mark.parametrize("T", [1, 17, 40])
@pytest.mark.parametrize("attend_current", [False, True])
def test_stickbreaking_small(T, attend_current):
    run_sb(2, 2, T, 16, attend_current, torch.float32)


def test_stickbreaking_small_cumsum_scan():
    """The in-block prefix/suffix sums by tl.cumsum instead of tensor-core products."""
    run_sb(1, 2, 70, 16, True, torch.float32, config={"scan": ("cumsum",)})


def test_stickbreaking_rejects_bad_arguments():
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match="must all be"):
        kernel.stickbreaking_triton(q, q[:, :1], q)
    with pytest.raises(ValueError, match="tile settings"):
        kernel.stickbreaking_triton(q, q, q, config={"scan": ("fft",)})


def test_causal():
    T, t = (40, 17) if not CUDA else (300, 150)
    assert causal_gap(kernel.stickbreaking_triton, T, t) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("T", GPU_T)
@pytest.mark.parametrize("attend_current", [False, True])
def test_gpu_stickbreaking(T, attend_current):
    run_sb(batch_for(T), 12, T, 64, attend_current, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [32, 128])
def test_gpu_stickbreaking_head_dims(d):
    run_sb(2, 4, 1000, d, False, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("q_scale", [4.0, 8.0])
def test_gpu_stickbreaking_large_logits(q_scale):
    run_sb(1, 12, 2048, 64, False, torch.bfloat16, q_scale)


@pytest.mark.gpu
def test_gpu_stickbreaking_fp32():
    run_sb(2, 2, 300, 32, False, torch.float32)


def run_masked(B, H, T, d, window, docs, attend_current=False, dtype=torch.float32, tol=None):
    """The kernels with a window and/or document ids against the dense reference with the same mask."""
    torch.manual_seed(0)
    # logits near -4 (q near +1, k near -1): each stick breaks slowly, so far keys keep real weights
    # and a key wrongly let through at a window's edge shows in the comparison
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    with torch.no_grad():
        q.mul_(0.1).add_(1.0)
        k.mul_(0.1).sub_(4 / d ** 0.5)  # q . k / sqrt(d) = -4 on average: beta about 0.018
    segments = None
    if docs:  # documents of random lengths (one sequence's cuts mirrored in the other)
        cuts = sorted(torch.randperm(T - 1)[:docs - 1].add(1).tolist()) if T > 1 else []
        ids = torch.zeros(T, dtype=torch.long)
        for c in cuts:
            ids[c:] += 1
        segments = torch.stack([ids, ids[-1] - ids.flip(0)][:B]).to(DEVICE)
    do = torch.randn(B, H, T, d, device=DEVICE)
    drem = torch.randn(B, H, T, device=DEVICE)
    out, rem = kernel.stickbreaking_triton(q, k, v, attend_current, window=window, segments=segments)
    grads = torch.autograd.grad((out, rem), (q, k, v), (do.to(dtype), drem))
    refs = [fp32_copy(x) for x in (q, k, v)]
    ref, ref_rem = stickbreaking_reference(*refs, attend_current, window=window, segments=segments)
    ref_grads = torch.autograd.grad((ref, ref_rem), refs, (do, drem))
    compare(f"stickbreaking masked B{B} H{H} T{T} W{window} docs{docs} {dtype}", [out, rem, *grads],
            [ref, ref_rem, *ref_grads], ["out", "rem", "dq", "dk", "dv"], tol or tolerance(dtype))


@pytest.mark.parametrize("T,window", [(1, 1), (63, 1), (63, 62), (111, 40), (111, 70), (111, 200), (70, 33)])
def test_stickbreaking_window(T, window):
    run_masked(2, 2, T, 16, window, 0)


@pytest.mark.parametrize("T,docs", [(1, 1), (63, 5), (111, 9)])
def test_stickbreaking_documents(T, docs):
    run_masked(2, 2, T, 16, 0, docs, attend_current=True)


def test_stickbreaking_window_and_documents():
    run_masked(2, 2, 111, 16, 37, 4)


def test_stickbreaking_masked_reference_is_the_loop():
    """The masked reference against the product of sticks over the visible keys only."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 13, 8, dtype=torch.float64) for _ in range(3))
    out, rem = stickbreaking_reference(q, k, v, window=4)
    z = (q @ k.transpose(-1, -2))[0, 0] / 8 ** 0.5
    for i in range(13):
        left, acc = 1.0, torch.zeros(8, dtype=torch.float64)
        for j in range(i - 1, max(i - 4, -1), -1):  # nearest key first: it breaks the stick first
            beta = torch.sigmoid(z[i, j])
            acc += left * beta * v[0, 0, j]
            left = left * (1 - beta)
        assert_close(out[0, 0, i], acc, 1e-12, floor=1.0)
        assert abs(float(rem[0, 0, i]) - float(left)) < 1e-12


def test_stickbreaking_window_causal_gap():
    """A key farther than the window changes no output (the kernel skips or masks its tile)."""
    q, k, v = (torch.randn(1, 2, 96, 16, device=DEVICE) for _ in range(3))
    out, _ = kernel.stickbreaking_triton(q, k, v, window=20)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 10] += 5.0
    v2[:, :, 10] += 5.0
    out2, _ = kernel.stickbreaking_triton(q, k2, v2, window=20)
    assert torch.equal(out[:, :, 30:], out2[:, :, 30:])  # rows 30.. see keys 11..: untouched
    assert not torch.equal(out[:, :, 11:30], out2[:, :, 11:30])


@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("window,docs,later", [(0, True, 32), (20, False, 64)])
def test_stickbreaking_skips_tiles_out_of_reach(attend_current, window, docs, later):
    """Documents on tile boundaries (32 x 32 tiles), or a window of 20: the kernels never read a tile
    wholly in an earlier document (a stick-breaking row sees none of its keys) or before a block's
    window: cost O(the documents) or O(W), not O(T). NaNs in q, k, v at positions 0..31 reach none
    of the outputs, remainders and gradients from `later` on, which match the reference's."""
    torch.manual_seed(0)
    T = 96
    segments = (torch.arange(T, device=DEVICE) // 32)[None].expand(2, T) if docs else None
    q, k, v = (torch.randn(2, 2, T, 16, device=DEVICE) for _ in range(3))
    ref = [x.clone().requires_grad_() for x in (q, k, v)]
    for x in (q, k, v):
        x[..., :32, :] = float("nan")
        x.requires_grad_()
    do, drem = torch.randn(2, 2, T, 16, device=DEVICE), torch.randn(2, 2, T, device=DEVICE)
    config = {"fwd": (32, 32, 4, 1), "bwd": (32, 32, 4, 1)}
    out, rem = kernel.stickbreaking_triton(q, k, v, attend_current, config=config, window=window, segments=segments)
    grads = torch.autograd.grad((out, rem), (q, k, v), (do, drem))
    ref_out, ref_rem = stickbreaking_reference(*ref, attend_current, window=window, segments=segments)
    ref_grads = torch.autograd.grad((ref_out, ref_rem), ref, (do, drem))
    later = slice(later, None)
    compare(f"stickbreaking out of reach W{window} docs{docs}", [out[..., later, :], rem[..., later], *(g[..., later, :] for g in grads)],
            [ref_out[..., later, :], ref_rem[..., later], *(g[..., later, :] for g in ref_grads)],
            ["out", "rem", "dq", "dk", "dv"], 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("T,window,docs", [(1000, 1, 0), (1000, 129, 0), (4096, 512, 0), (4096, 0, 8), (4096, 700, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_stickbreaking_masked(T, window, docs, dtype):
    run_masked(batch_for(T), 4, T, 64, window, docs, dtype=dtype)
