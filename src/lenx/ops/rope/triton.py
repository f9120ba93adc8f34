"""q and k rotated by RoPE in one launch (reference.py has the formula), and the backward in one
more: the rotation's transpose is the rotation by minus the angle, i.e. the same kernel with sin's
sign turned. Unfused, the rotation is about ten elementwise kernels a layer each way (products, a
negation, concatenations, casts), which cost RoPE about 7 ms of a 46 ms 125m step at T 512 B 32.

One program per (batch x head, block of positions) reads a [BT, D] tile of q and of k by their strides
(the projection's permuted views need no copy), each element with its rotation partner (j + h or
j - h, itself past the rotated dims), and writes contiguous outputs. The angles' cos and sin come as
fp32 tables [B or 1, T, h]; the products are in fp32, one rounding to the input's dtype at the end.

An optional per-row factor f [B or 1, H or 1, T] (fp32, no gradient) scales q's rotation, not k's: a
query temperature folded into the pass that writes q anyway. A row's factor commutes with its
rotation, so the backward is the same kernel again: dq = f R^T(dq').
"""

import torch
import triton
import triton.language as tl

from .._launch import new, pow2


@triton.jit
def _rotate_tile(x_ptr, y_ptr, b, hd, t, j, cos, sin, sign, scale, x_sb, x_sh, x_st, H, T, D: tl.constexpr,
                 HALF: tl.constexpr):
    partner = tl.where(j < HALF, j + HALF, tl.where(j < 2 * HALF, j - HALF, j))
    rows = t[:, None] < T
    inside = rows & (j[None, :] < D)
    base = x_ptr + b * x_sb + hd * x_sh + t[:, None] * x_st
    x = tl.load(base + j[None, :], mask=inside, other=0.0).to(tl.float32)
    xp = tl.load(base + partner[None, :], mask=inside, other=0.0).to(tl.float32)
    y = (x * cos + sign * xp * sin) * scale
    out = y_ptr + ((b * H + hd) * T + t[:, None]) * D + j[None, :]
    tl.store(out, y.to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _rotate_qk(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, f_ptr, q_sb, q_sh, q_st, k_sb, k_sh, k_st, c_sb,
               f_sb, f_sh, H, T, D: tl.constexpr, HALF: tl.constexpr, DP: tl.constexpr, BT: tl.constexpr,
               INVERSE: tl.constexpr, SCALED: tl.constexpr):
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
    _rotate_tile(q_ptr, qo_ptr, b, hd, t, j, cos, sin, sign, scale, q_sb, q_sh, q_st, H, T, D, HALF)
    _rotate_tile(k_ptr, ko_ptr, b, hd, t, j, cos, sin, sign, 1.0, k_sb, k_sh, k_st, H, T, D, HALF)


def _launch(q, k, cos, sin, f, inverse: bool):
    B, H, T, D = q.shape
    half = cos.shape[-1]
    qo = new((B, H, T, D), q)
    ko = new((B, H, T, D), k)
    dp = pow2(D, 16)
    bt = max(1, min(64, 4096 // dp))
    c_sb = 0 if cos.shape[0] == 1 else cos.stride(0)
    f_sb, f_sh = (0, 0) if f is None else (0 if f.shape[i] == 1 else f.stride(i) for i in (0, 1))
    grid = (triton.cdiv(T, bt), B * H)
    _rotate_qk[grid](q, k, qo, ko, cos, sin, cos if f is None else f, q.stride(0), q.stride(1), q.stride(2),
                     k.stride(0), k.stride(1), k.stride(2), c_sb, f_sb, f_sh, H, T, D, half, dp, bt, inverse,
                     f is not None)
    return qo, ko


class _RotateQK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, f):
        ctx.save_for_backward(cos, sin, f)
        return _launch(q, k, cos, sin, f, False)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin, f = ctx.saved_tensors
        dq, dk = (g if g.stride(-1) == 1 else g.contiguous() for g in (dq, dk))
        return (*_launch(dq, dk, cos, sin, f, True), None, None, None)


def rotate_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              q_scale: torch.Tensor | None = None):
    """q, k [B, H, T, d] (any strides with the last one 1, one dtype) rotated by cos, sin [T, h] or [B, T, h]
    (fp32, no gradient; 2h <= d): (q', k') contiguous, differentiable in q and k. q_scale: a factor per
    row of q (no gradient) that broadcasts to [B, H, T] ([T], [H, T], [B, 1, T], ...): q' is the rotated
    row times it, one rounding."""
    if q.shape != k.shape or q.dim() != 4 or q.dtype != k.dtype or q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError(f"q and k must be [B, H, T, d] of one shape and dtype with unit last strides, got "
                         f"{tuple(q.shape)} {q.dtype}, {tuple(k.shape)} {k.dtype}")
    B, H, T, D = q.shape
    cos, sin = (c.reshape(-1, T, c.shape[-1]).float().contiguous() for c in (cos, sin))
    if cos.shape != sin.shape or cos.shape[0] not in (1, B) or 2 * cos.shape[-1] > D:
        raise ValueError(f"cos and sin must be [T, h] or [B, T, h] with 2h <= d = {D}, got {tuple(cos.shape)}")
    f = None
    if q_scale is not None:
        f = q_scale.detach()
        f = f.reshape((1,) * (3 - f.dim()) + tuple(f.shape)) if f.dim() <= 3 else f
        if f.dim() != 3 or f.shape[0] not in (1, B) or f.shape[1] not in (1, H) or f.shape[2] != T:
            raise ValueError(f"q_scale must broadcast to [B, H, T] = {[B, H, T]} with T whole, got "
                             f"{tuple(q_scale.shape)}")
        f = f.float().contiguous()
    return _RotateQK.apply(q, k, cos, sin, f)
