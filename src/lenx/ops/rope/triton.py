"""q and k rotated by RoPE in one launch (reference.py has the formula), and the backward in one
more: the rotation's transpose is the rotation by minus the angle, i.e. the same kernel with sin's
sign turned. Unfused, the rotation is about ten elementwise kernels a layer each way (products, a
negation, concatenations, casts), which cost RoPE about 7 ms of a 46 ms 125m step at T 512 B 32.

One program per (batch x head, block of positions) reads a [BT, D] tile of q and of k by their strides
(the projection's permuted views need no copy), each element with its rotation partner (j + h or
j - h, itself past the rotated dims), and writes [B, H, T, D] outputs, contiguous or (heads_last)
[B, T, H, D] in memory: the layout SDPA then gives its output, which the output projection reads as
it is (contiguous, it would be copied to [B, T, C] first). The angles' cos and sin come as fp32
tables [B or 1, T, h]; the products are in fp32, one rounding to the input's dtype at the end.

An optional per-row factor f [B or 1, H or 1, T] (fp32, no gradient) scales q's rotation, not k's: a
query temperature folded into the pass that writes q anyway. A row's factor commutes with its
rotation, so the backward is the same kernel again: dq = f R^T(dq').

rotate_qkv takes the attention's projection output [B, T, 3, H, D] itself: its backward writes that
output's gradient as one buffer (dq and dk rotated into their slots by the kernel, dv copied into its
own), where autograd would stack three gradients and copy the stack to the projection's layout.
"""

import torch
import triton
import triton.language as tl

from .._launch import new, pow2


@triton.jit
def _rotate_tile(x_ptr, y_ptr, b, hd, t, j, cos, sin, sign, scale, x_sb, x_sh, x_st, y_sb, y_sh, y_st, T,
                 D: tl.constexpr, HALF: tl.constexpr):
    partner = tl.where(j < HALF, j + HALF, tl.where(j < 2 * HALF, j - HALF, j))
    rows = t[:, None] < T
    inside = rows & (j[None, :] < D)
    base = x_ptr + b * x_sb + hd * x_sh + t[:, None] * x_st
    x = tl.load(base + j[None, :], mask=inside, other=0.0).to(tl.float32)
    xp = tl.load(base + partner[None, :], mask=inside, other=0.0).to(tl.float32)
    y = (x * cos + sign * xp * sin) * scale
    out = y_ptr + b * y_sb + hd * y_sh + t[:, None] * y_st + j[None, :]
    tl.store(out, y.to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _rotate_qk(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, f_ptr, q_sb, q_sh, q_st, k_sb, k_sh, k_st, o_sb,
               o_sh, o_st, c_sb, f_sb, f_sh, H, T, D: tl.constexpr, HALF: tl.constexpr, DP: tl.constexpr,
               BT: tl.constexpr, INVERSE: tl.constexpr, SCALED: tl.constexpr):
    bh = tl.program_id(1)
    b, hd = bh // H, bh % H
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    j = tl.arange(0, DP)
    f = tl.where(j < HALF, j, j - HALF)  # the frequency of dim j (past the rotated dims: none)
    rotated = j < 2 * HALF
    trig = (t[:, None] < T) & rotated[None, :]
    at = b * c_sb + t[:, None] * HALF + f[None, :]
    cos = tl.where(rotated[None, :], tl.load(cos_ptr + at, mask=trig, other=1.0), 1.0)
    sin = tl.load(sin_ptr + at, mask=trig, other=0.0)
    sign = tl.where(j < HALF, -1.0, 1.0)[None, :]
    if INVERSE:
        sign = -sign
    scale = 1.0
    if SCALED:
        scale = tl.load(f_ptr + b * f_sb + hd * f_sh + t, mask=t < T, other=0.0)[:, None]
    _rotate_tile(q_ptr, qo_ptr, b, hd, t, j, cos, sin, sign, scale, q_sb, q_sh, q_st, o_sb, o_sh, o_st, T, D,
                 HALF)
    _rotate_tile(k_ptr, ko_ptr, b, hd, t, j, cos, sin, sign, 1.0, k_sb, k_sh, k_st, o_sb, o_sh, o_st, T, D, HALF)


def _launch(q, k, cos, sin, f, inverse: bool, heads_last: bool = False, out=None):
    """(q', k'), q' scaled by f (None: unscaled): new tensors (contiguous, or [B, T, H, D] in memory
    when heads_last), or written into out = (q', k'), two [B, H, T, D] views of one layout."""
    B, H, T, D = q.shape
    half = cos.shape[-1]
    if out is not None:
        qo, ko = out
    else:
        shape = (B, T, H, D) if heads_last else (B, H, T, D)
        qo, ko = new(shape, q), new(shape, k)
        if heads_last:
            qo, ko = qo.transpose(1, 2), ko.transpose(1, 2)
    dp = pow2(D, 16)
    bt = max(1, min(64, 4096 // dp))
    c_sb = 0 if cos.shape[0] == 1 else cos.stride(0)
    f_sb, f_sh = (0, 0) if f is None else (0 if f.shape[i] == 1 else f.stride(i) for i in (0, 1))
    grid = (triton.cdiv(T, bt), B * H)
    _rotate_qk[grid](q, k, qo, ko, cos, sin, cos if f is None else f, q.stride(0), q.stride(1), q.stride(2),
                     k.stride(0), k.stride(1), k.stride(2), qo.stride(0), qo.stride(1), qo.stride(2), c_sb, f_sb,
                     f_sh, H, T, D, half, dp, bt, inverse, f is not None)
    return qo, ko


class _RotateQK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, f, heads_last):
        ctx.save_for_backward(cos, sin, f)
        return _launch(q, k, cos, sin, f, False, heads_last)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin, f = ctx.saved_tensors
        dq, dk = (g if g.stride(-1) == 1 else g.contiguous() for g in (dq, dk))
        return (*_launch(dq, dk, cos, sin, f, True), None, None, None, None)  # contiguous: stacked with dv next


class _RotateQKV(torch.autograd.Function):
    """q and k rotated out of the projection's output [B, T, 3, H, D], v a view of it. The backward
    writes the projection's gradient into one buffer of that layout: dq and dk rotated back into their
    slots by the kernel, dv copied into its own; autograd would otherwise rotate into new tensors,
    stack the three and copy the stack to the projection's layout."""

    @staticmethod
    def forward(ctx, qkv, cos, sin, f, heads_last):
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        ctx.save_for_backward(cos, sin, f)
        ctx.qkv_shape = qkv.shape
        return (*_launch(q, k, cos, sin, f, False, heads_last), v)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        cos, sin, f = ctx.saved_tensors  # (an unused output's gradient comes as zeros: autograd materializes it)
        grad = new(ctx.qkv_shape, dq)
        slots = [grad[:, :, i].transpose(1, 2) for i in range(3)]
        dq, dk = (g if g.stride(-1) == 1 else g.contiguous() for g in (dq, dk))
        _launch(dq, dk, cos, sin, f, True, out=slots[:2])
        slots[2].copy_(dv)
        return grad, None, None, None, None


def rotate_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
              q_scale: torch.Tensor | None = None, heads_last: bool = False):
    """q, k [B, H, T, d] (any strides with the last one 1, one dtype) rotated by cos, sin [T, h] or [B, T, h]
    (fp32, no gradient; 2h <= d): (q', k') [B, H, T, d], contiguous or (heads_last) transposed views of
    contiguous [B, T, H, d]; differentiable in q and k. q_scale: a factor per row of q (no gradient)
    that broadcasts to [B, H, T] ([T], [H, T], [B, 1, T], ...): q' is the rotated row times it, one
    rounding."""
    if q.shape != k.shape or q.dim() != 4 or q.dtype != k.dtype or q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError(f"q and k must be [B, H, T, d] of one shape and dtype with unit last strides, got "
                         f"{tuple(q.shape)} {q.dtype}, {tuple(k.shape)} {k.dtype}")
    B, H, T, D = q.shape
    cos, sin = _tables(cos, sin, B, T, D)
    return _RotateQK.apply(q, k, cos, sin, _row_scale(q_scale, B, H, T), heads_last)


def rotate_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, q_scale: torch.Tensor | None = None,
               heads_last: bool = False):
    """The projection's output qkv [B, T, 3, H, d] (last stride 1) -> (q', k', v) [B, H, T, d]: q and k
    rotated (q's rows scaled by q_scale) as rotate_qk's, v a view of qkv; the gradient of qkv comes
    back in one buffer."""
    if qkv.dim() != 5 or qkv.shape[2] != 3 or qkv.stride(-1) != 1:
        raise ValueError(f"qkv must be [B, T, 3, H, d] with a unit last stride, got {tuple(qkv.shape)}")
    B, T, _, H, D = qkv.shape
    cos, sin = _tables(cos, sin, B, T, D)
    return _RotateQKV.apply(qkv, cos, sin, _row_scale(q_scale, B, H, T), heads_last)


def _tables(cos, sin, B, T, D):
    """cos, sin as the kernel reads them: fp32 [1 or B, T, h], contiguous (checked)."""
    cos, sin = (c.reshape(-1, T, c.shape[-1]).float().contiguous() for c in (cos, sin))
    if cos.shape != sin.shape or cos.shape[0] not in (1, B) or 2 * cos.shape[-1] > D:
        raise ValueError(f"cos and sin must be [T, h] or [B, T, h] with 2h <= d = {D}, got {tuple(cos.shape)}")
    return cos, sin


def _row_scale(q_scale, B, H, T):
    """q_scale as the kernel reads it: fp32 [1 or B, 1 or H, T], contiguous, no gradient (checked); None
    stays None."""
    if q_scale is None:
        return None
    f = q_scale.detach()
    f = f.reshape((1,) * (3 - f.dim()) + tuple(f.shape)) if f.dim() <= 3 else f
    if f.dim() != 3 or f.shape[0] not in (1, B) or f.shape[1] not in (1, H) or f.shape[2] != T:
        raise ValueError(f"q_scale must broadcast to [B, H, T] = {[B, H, T]} with T whole, got {tuple(q_scale.shape)}")
    return f.float().contiguous()
