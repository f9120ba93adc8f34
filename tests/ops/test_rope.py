"""lenx.ops.rope: the reference against the RoPE module's rotation, and the fused kernel (triton.py)
against the reference, forward and backward, full and partial rotation, shared and per-sequence
tables, strided inputs. Without CUDA the kernel runs under Triton's interpreter."""

import pytest
import torch

from helpers import assert_close
from kernel_cases import DEVICE
from lenx.attention.rope import RoPE
from lenx.ops.rope.reference import rotate_reference


def tables(rope, T, B=None):
    pos = torch.arange(T) if B is None else torch.stack([torch.arange(T) + 3 * b for b in range(B)])
    cos, sin = rope.table(pos, dtype=torch.float64)
    h = rope.rotary // 2
    return cos[..., :h], sin[..., :h]


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_reference_is_the_modules_rotation(fraction):
    rope = RoPE(16, fraction=fraction).double()
    x = torch.randn(2, 3, 11, 16, dtype=torch.float64)
    cos, sin = tables(rope, 11)
    full_cos, full_sin = rope.table(torch.arange(11), dtype=torch.float64)
    assert_close(rotate_reference(x, cos, sin), RoPE.rotate(x, full_cos, full_sin), 1e-14)


pytest.importorskip("triton")
from lenx.ops.rope.triton import rotate_qk, rotate_qkv  # noqa: E402


def check(B, H, T, d, fraction=1.0, per_sequence=False, dtype=torch.float32, strided=False, tol=1e-6,
          heads_last=False, scale=None):
    """scale: the shape of a per-row factor on q ([T], [H, T], [B, 1, T], ...; None: none)."""
    rope = RoPE(d, fraction=fraction)
    cos, sin = tables(rope, T, B if per_sequence else None)
    if strided:  # the projection's layout: [B, T, 3, H, d] permuted to q, k, v [B, H, T, d]
        qkv = torch.randn(B, T, 3, H, d, device=DEVICE).permute(2, 0, 3, 1, 4).to(dtype)
        q, k = (t.detach().requires_grad_() for t in (qkv[0], qkv[1]))
    else:
        q, k = (torch.randn(B, H, T, d, device=DEVICE, dtype=dtype, requires_grad=True) for _ in range(2))
    cos_d, sin_d = (c.to(DEVICE) for c in (cos, sin))
    f = None if scale is None else (torch.rand(scale, device=DEVICE) * 3 + 0.1)
    qo, ko = rotate_qk(q, k, cos_d, sin_d, q_scale=f, heads_last=heads_last)
    memory = (lambda x: x.transpose(1, 2)) if heads_last else (lambda x: x)  # noqa: E731  ([B, T, H, d] or as is)
    assert qo.dtype == dtype and memory(qo).is_contiguous() and memory(ko).is_contiguous()
    dq_out, dk_out = torch.randn_like(qo), torch.randn_like(ko)
    dq, dk = torch.autograd.grad((qo, ko), (q, k), (dq_out, dk_out))
    assert dq.is_contiguous() and dk.is_contiguous()  # the backward writes contiguous gradients
    refs = [x.detach().double().requires_grad_() for x in (q, k)]
    ref_q, ref_k = (rotate_reference(x, cos_d.double(), sin_d.double()) for x in refs)  # [B, 1, T, h] per sequence
    if f is not None:  # q's rows only
        ref_q = ref_q * f.double()[..., None]
    ref_dq, ref_dk = torch.autograd.grad((ref_q, ref_k), refs, (dq_out.double(), dk_out.double()))
    for name, a, b in (("q", qo, ref_q), ("k", ko, ref_k), ("dq", dq, ref_dq), ("dk", dk, ref_dk)):
        assert_close(a, b, tol, f"B{B} H{H} T{T} d{d} p{fraction} {dtype} {name}")


@pytest.mark.parametrize("T", [1, 63, 111])
@pytest.mark.parametrize("d", [16, 64])
def test_fused_rotation(T, d):
    check(2, 3, T, d)


@pytest.mark.parametrize("fraction", [0.5, 0.25])
def test_fused_partial_rotation(fraction):
    check(2, 2, 37, 32, fraction=fraction)


@pytest.mark.parametrize("heads_last", [False, True])
def test_fused_per_sequence_tables_and_strided_inputs(heads_last):
    check(3, 2, 21, 16, per_sequence=True, strided=True, heads_last=heads_last)


@pytest.mark.parametrize("fraction", [1.0, 0.25])
def test_fused_heads_last(fraction):
    """heads_last: outputs [B, T, H, d] in memory (SDPA then gives its output that layout)."""
    check(2, 3, 37, 32, fraction=fraction, strided=True, heads_last=True)


def test_fused_odd_head_dim():
    check(1, 2, 9, 24)  # d not a power of two: the tile is padded and the pad masked


@pytest.mark.parametrize("scale", [(37,), (3, 37), (2, 1, 37), (2, 3, 37), (1, 3, 37)])
def test_fused_rotation_scales_q_s_rows(scale):
    """A query temperature folded into q's rotation: [T] (log n), [H, T] (SSMax's s_h log n), per
    sequence [B, 1, T] and [B, H, T]; k as it was, the backward scaled the same."""
    check(2, 3, 37, 16, scale=scale, strided=True)


def test_fused_rotation_scales_partial_and_per_sequence_rotations():
    check(2, 2, 21, 32, fraction=0.5, per_sequence=True, scale=(2, 2, 21), heads_last=True)


def check_qkv(B, T, H, d, fraction=1.0, per_sequence=False, dtype=torch.float32, heads_last=False, tol=1e-6,
              scale=None):
    """rotate_qkv on the projection's output [B, T, 3, H, d]: q and k rotated (q's rows times a factor
    of shape `scale`, None: none), v its view, and the projection's gradient (one buffer) against the
    float64 reference rotation of the split views."""
    rope = RoPE(d, fraction=fraction)
    cos, sin = (c.to(DEVICE) for c in tables(rope, T, B if per_sequence else None))
    y = torch.randn(B, T, 3 * H * d, device=DEVICE).to(dtype).requires_grad_()
    f = None if scale is None else (torch.rand(scale, device=DEVICE) * 3 + 0.1)
    q, k, v = rotate_qkv(y.view(B, T, 3, H, d), cos, sin, q_scale=f, heads_last=heads_last)
    assert q.shape == k.shape == v.shape == (B, H, T, d) and q.dtype == dtype
    assert (q.transpose(1, 2) if heads_last else q).is_contiguous()
    grads = [torch.randn(B, H, T, d, device=DEVICE).to(dtype) for _ in range(3)]
    dy, = torch.autograd.grad((q, k, v), y, grads)
    ref_y = y.detach().double().requires_grad_()
    ref_q, ref_k, ref_v = ref_y.view(B, T, 3, H, d).permute(2, 0, 3, 1, 4)
    ref_q, ref_k = (rotate_reference(x, cos.double(), sin.double()) for x in (ref_q, ref_k))
    if f is not None:  # q's rows only
        ref_q = ref_q * f.double()[..., None]
    ref_dy, = torch.autograd.grad((ref_q, ref_k, ref_v), ref_y, [g.double() for g in grads])
    assert dy.is_contiguous()
    for name, a, b in (("q", q, ref_q), ("k", k, ref_k), ("v", v, ref_v), ("dqkv", dy, ref_dy)):
        assert_close(a, b, tol, f"B{B} T{T} H{H} d{d} p{fraction} {dtype} {name}")


@pytest.mark.parametrize("heads_last", [False, True])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_fused_rotation_of_the_projection(heads_last, fraction):
    check_qkv(2, 19, 3, 16, fraction=fraction, heads_last=heads_last)


def test_fused_rotation_of_the_projection_per_sequence_odd_dim():
    check_qkv(3, 9, 2, 24, per_sequence=True, heads_last=True)


@pytest.mark.parametrize("heads_last", [False, True])
@pytest.mark.parametrize("scale", [(19,), (3, 19), (2, 1, 19)])
def test_fused_rotation_of_the_projection_scales_q_s_rows(scale, heads_last):
    """A query temperature on the attention's path: log n's [T], SSMax's [H, T], a per-sequence
    [B, 1, T]; q's rows scaled, k's not, and the projection's gradient of q's slot scaled the same."""
    check_qkv(2, 19, 3, 16, fraction=0.5, heads_last=heads_last, scale=scale)


def test_fused_rotation_of_the_projection_unused_outputs():
    """A gradient that reaches only v (q and k unused) still gives the projection's whole gradient."""
    cos, sin = tables(RoPE(16), 5)
    y = torch.randn(1, 5, 3 * 2 * 16, device=DEVICE, requires_grad=True)
    q, k, v = rotate_qkv(y.view(1, 5, 3, 2, 16), cos.to(DEVICE).float(), sin.to(DEVICE).float())
    v.sum().backward()
    expected = torch.zeros(1, 5, 3, 2, 16, device=DEVICE)
    expected[:, :, 2] = 1
    assert torch.equal(y.grad, expected.view(1, 5, -1))


def test_rejects_mismatched_inputs():
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    cos = torch.zeros(8, 8, device=DEVICE)
    with pytest.raises(ValueError, match="one shape and dtype"):
        rotate_qk(q, q[:, :1], cos, cos)
    with pytest.raises(ValueError, match="2h <= d"):
        rotate_qk(q, q, torch.zeros(8, 9, device=DEVICE), torch.zeros(8, 9, device=DEVICE))
    for bad in (torch.ones(7, device=DEVICE), torch.ones(3, 8, device=DEVICE), torch.ones(1, 2, 8, 1, device=DEVICE)):
        with pytest.raises(ValueError, match="q_scale must broadcast"):
            rotate_qk(q, q, cos, cos, q_scale=bad)
        with pytest.raises(ValueError, match="q_scale must broadcast"):
            rotate_qkv(torch.ones(1, 8, 3, 2, 16, device=DEVICE), cos, cos, q_scale=bad)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 111, 4096])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads_last", [False, True])
def test_gpu_fused_rotation(T, dtype, heads_last):
    # bf16: one rounding of the fp32 result (2^-9 relative), against the float64 reference
    check(2, 12, T, 64, dtype=dtype, strided=True, tol=1e-6 if dtype == torch.float32 else 5e-3, heads_last=heads_last)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_fused_rotation_of_the_projection(dtype):
    # bf16: one rounding of each rotated value or gradient (dv is copied exactly)
    check_qkv(4, 512, 12, 64, dtype=dtype, heads_last=True, tol=1e-6 if dtype == torch.float32 else 5e-3)
    check_qkv(2, 77, 4, 64, fraction=0.5, per_sequence=True, dtype=dtype, tol=1e-6 if dtype == torch.float32 else 5e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 111, 4096])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_fused_rotation_with_a_row_scale(T, dtype):
    """SSMax's [H, T] factor and log n's [T] on q's rows, forward and backward (one rounding in bf16)."""
    for scale in ((12, T), (T,)):
        check(2, 12, T, 64, dtype=dtype, strided=True, tol=1e-6 if dtype == torch.float32 else 5e-3, scale=scale)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_fused_rotation_of_the_projection_with_a_row_scale(dtype):
    """The attention's path with a query temperature: rotate_qkv, SDPA's heads-last layout, SSMax's
    [H, T] and a per-sequence log n [B, 1, T] on q's rows; the gradient of qkv in one buffer."""
    tol = 1e-6 if dtype == torch.float32 else 5e-3
    check_qkv(4, 512, 12, 64, dtype=dtype, heads_last=True, tol=tol, scale=(12, 512))
    check_qkv(2, 77, 4, 64, fraction=0.5, per_sequence=True, dtype=dtype, tol=tol, scale=(2, 1, 77))


@pytest.mark.gpu
def test_gpu_module_uses_the_fused_rotation_and_matches_cpu():
    """The RoPE part on CUDA (the fused kernel) against the same part on the CPU (unfused), with
    per-sequence positions and partial rotation."""
    rope = RoPE(64, fraction=0.5)
    q, k = (torch.randn(2, 4, 300, 64) for _ in range(2))
    pos = torch.stack([torch.arange(300), torch.arange(300) + 7])
    cpu = rope(q, k, pos)
    gpu = rope.cuda()(q.cuda(), k.cuda(), pos.cuda())
    for a, b in zip(gpu, cpu):
        assert_close(a.cpu(), b, 1e-5)
