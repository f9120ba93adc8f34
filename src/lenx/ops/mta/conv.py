"""MTA's per-head query-key convolution (reference.py's _conv without documents) as a Triton stencil,
forward and backward:

    y[b, h, i, j] = sum_{a < c_q, t < c_k} w[h, 0, a, t] x[b, h, i - (c_q - 1) + a, j - c_k // 2 + t]

with zeros outside x [B, H, Tq, Tk]. PyTorch runs it as a grouped (depthwise) conv2d whose native
kernels, on [B, H, T, T] score maps, took ~70 of MTA's ~200 ms of attention per 125m step at T 512
B 32 (H200); the stencil is memory bound, so one pass over the map each way should do.

One program per (row block, key block) of one (batch, head): for each of the c_q x c_k taps it loads
the input tile shifted by that tap (masked: zeros outside the map; the shifted tiles overlap, so
all but the first come from the cache) and accumulates in fp32; the output is in x's dtype.

The backward is one more pass of the same shape over x's tiles: with g = dL/dy,

    dx[r, s] = sum_{a, t} w[a, t] g[r + (c_q - 1) - a, s + c_k // 2 - t]
    dw[a, t] = sum_{b, r, s} x[r, s] g[r + (c_q - 1) - a, s + c_k // 2 - t]

both from the same shifted tiles of g. Each program writes its c_q c_k partial sums of dw (fp32) to
a buffer of its own, and torch sums the buffer: no float atomics, so dw is reproducible.
"""

import torch
import triton
import triton.language as tl

from .._launch import new, pow2
from .route import MAX_KERNEL, fits


@triton.jit
def _conv_fwd(x_ptr, w_ptr, y_ptr, H, Tq, Tk, CQ: tl.constexpr, CK: tl.constexpr, BM: tl.constexpr,
              BN: tl.constexpr):
    n_col = tl.cdiv(Tk, BN)
    pid, bh = tl.program_id(0), tl.program_id(1)
    rows = (pid // n_col) * BM + tl.arange(0, BM)
    cols = (pid % n_col) * BN + tl.arange(0, BN)
    base = bh.to(tl.int64) * Tq * Tk
    w_base = w_ptr + (bh % H) * (CQ * CK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for a in tl.static_range(CQ):
        r = rows + (a - (CQ - 1))
        r_ok = (r >= 0) & (r < Tq)
        for t in tl.static_range(CK):
            c = cols + (t - CK // 2)
            inside = r_ok[:, None] & ((c >= 0) & (c < Tk))[None, :]
            tile = tl.load(x_ptr + base + r[:, None] * Tk + c[None, :], mask=inside, other=0.0)
            acc += tl.load(w_base + a * CK + t) * tile.to(tl.float32)
    out = (rows < Tq)[:, None] & (cols < Tk)[None, :]
    tl.store(y_ptr + base + rows[:, None] * Tk + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=out)


@triton.jit
def _conv_bwd(x_ptr, g_ptr, w_ptr, dx_ptr, dw_ptr, H, Tq, Tk, CQ: tl.constexpr, CK: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, WANT_DX: tl.constexpr, WANT_DW: tl.constexpr):
    n_col = tl.cdiv(Tk, BN)
    pid, bh = tl.program_id(0), tl.program_id(1)
    rows = (pid // n_col) * BM + tl.arange(0, BM)
    cols = (pid % n_col) * BN + tl.arange(0, BN)
    base = bh.to(tl.int64) * Tq * Tk
    w_base = w_ptr + (bh % H) * (CQ * CK)
    here = (rows < Tq)[:, None] & (cols < Tk)[None, :]
    if WANT_DW:
        x = tl.load(x_ptr + base + rows[:, None] * Tk + cols[None, :], mask=here, other=0.0).to(tl.float32)
        dw_base = dw_ptr + (bh.to(tl.int64) * tl.num_programs(0) + pid) * (CQ * CK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for a in tl.static_range(CQ):
        r = rows + ((CQ - 1) - a)
        r_ok = r < Tq  # r >= 0: rows are, and the shift is not negative
        for t in tl.static_range(CK):
            c = cols + (CK // 2 - t)
            inside = r_ok[:, None] & ((c >= 0) & (c < Tk))[None, :]
            g = tl.load(g_ptr + base + r[:, None] * Tk + c[None, :], mask=inside, other=0.0).to(tl.float32)
            if WANT_DX:
                acc += tl.load(w_base + a * CK + t) * g
            if WANT_DW:
                tl.store(dw_base + a * CK + t, tl.sum(tl.sum(x * g, axis=1), axis=0))
    if WANT_DX:
        tl.store(dx_ptr + base + rows[:, None] * Tk + cols[None, :], acc.to(dx_ptr.dtype.element_ty), mask=here)


def check_kernel(x: torch.Tensor, kernel: torch.Tensor):
    """One-line errors for what the kernels do not take (before any launch)."""
    if x.dim() != 4 or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be [B, H, Tq, Tk] in fp16/bf16/fp32, got {x.dtype} {tuple(x.shape)}")
    if kernel.dim() != 4 or kernel.shape[0] != x.shape[1] or kernel.shape[1] != 1:
        raise ValueError(f"kernel must be [H, 1, c_q, c_k] with H = {x.shape[1]}, got {tuple(kernel.shape)}")
    if not fits(*kernel.shape[-2:]):
        raise ValueError(f"the Triton MTA convolution takes kernels up to {MAX_KERNEL[0]} x {MAX_KERNEL[1]} "
                         f"with c_k odd, got {kernel.shape[-2]} x {kernel.shape[-1]}")


def _tiles(Tq: int, Tk: int, block) -> tuple[int, int]:
    """(BM, BN): the given block or 32 x 64, no larger than the map needs (powers of two, >= 16)."""
    bm, bn = block or (32, 64)
    return min(bm, pow2(Tq)), min(bn, pow2(Tk))


def _forward(x, w, block=None):
    B, H, Tq, Tk = x.shape
    c_q, c_k = w.shape[-2:]
    bm, bn = _tiles(Tq, Tk, block)
    y = new(x.shape, x)
    grid = (triton.cdiv(Tq, bm) * triton.cdiv(Tk, bn), B * H)
    _conv_fwd[grid](x, w, y, H, Tq, Tk, c_q, c_k, bm, bn, num_warps=4)
    return y


def _backward(x, g, w, want_dx: bool, want_dw: bool, block=None):
    """(dx or None, dw [H, c_q, c_k] fp32 or None)."""
    B, H, Tq, Tk = x.shape
    c_q, c_k = w.shape[-2:]
    bm, bn = _tiles(Tq, Tk, block)
    grid = (triton.cdiv(Tq, bm) * triton.cdiv(Tk, bn), B * H)
    dx = new(x.shape, x) if want_dx else None
    parts = new((B, H, grid[0], c_q * c_k), x, torch.float32) if want_dw else None
    _conv_bwd[grid](x, g, w, x if dx is None else dx, w if parts is None else parts, H, Tq, Tk, c_q, c_k, bm, bn,
                    want_dx, want_dw, num_warps=4)
    dw = None if parts is None else parts.sum((0, 2)).view(H, c_q, c_k)  # a fixed-order sum: reproducible
    return dx, dw


class _Conv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, kernel, block):
        w = kernel.detach().float().contiguous()
        ctx.save_for_backward(x, w)
        ctx.kernel_dtype, ctx.block = kernel.dtype, block
        return _forward(x, w, block)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        want_dx, want_dw = ctx.needs_input_grad[:2]
        dx, dw = _backward(x, g.contiguous(), w, want_dx, want_dw, ctx.block)
        return dx, None if dw is None else dw.view(w.shape).to(ctx.kernel_dtype), None


def mta_conv(x: torch.Tensor, kernel: torch.Tensor, block: tuple[int, int] | None = None) -> torch.Tensor:
    """x [B, H, Tq, Tk] (fp16/bf16/fp32) convolved per head by kernel [H, 1, c_q, c_k] (c_q <= 8,
    c_k <= 15 and odd; used in fp32) as reference._conv(x, kernel) does: zero padding, c_q - 1 rows above and
    c_k // 2 keys on either side. Differentiable in x and kernel; the output is x's dtype, contiguous.
    block: the tile (BM, BN), powers of two >= 16 (default 32 x 64; for tuning)."""
    check_kernel(x, kernel)
    if block is not None and any(b < 16 or b & (b - 1) for b in block):
        raise ValueError(f"block must be two powers of two >= 16, got {block}")
    return _Conv.apply(x.contiguous(), kernel, block)
