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
