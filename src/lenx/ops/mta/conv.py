"""MTA's per-head query-key convolution (reference.py's _conv without documents) as Triton kernels,
forward and backward:

    y[b, h, i, j] = sum_{a < c_q, t < c_k} w[h, 0, a, t] x[b, h, i - (c_q - 1) + a, j - c_k // 2 + t]

with zeros outside x [B, H, Tq, Tk]. PyTorch runs it as a grouped (depthwise) conv2d whose native
kernels, on [B, H, T, T] score maps, took ~70 of MTA's ~200 ms of attention per 125m step at T 512
B 32 (H200). The work is c_q c_k (66 at 6 x 11) multiply-adds an entry; what costs is reading the
c_q c_k shifted inputs of each, so the kernels reuse what they read:

  _stream  y, and dx (the transposed stencil). One program per (row block, key block) of one (batch,
           head) walks its rows one at a time (and the c_q - 1 rows of halo before them): each input
           row is read once, at its c_k key shifts (c_k loads an entry, not c_q c_k), and added into
           the c_q output rows it feeds, held in registers (acc0..acc7, the first complete after
           the row and stored, then the others move up one). dx is the same walk upwards with the
           key shifts mirrored: dx[r, s] = sum_{a, t} w[a, t] g[r + (c_q - 1) - a, s + c_k // 2 - t].
  _dw      dw[a, t] = sum_{b, i, j} g[i, j] x[i - (c_q - 1) + a, j - c_k // 2 + t]: one program per
           (row block of g, key block) of one (batch, head) walks down x's rows (the c_q - 1 above
           its block included), reads each once as a [CKP, BN] tile of its c_k key shifts (masked:
           zeros outside the map), times the c_q rows of g it pairs with (held in registers), sums
           the products elementwise and reduces them over the keys once at the end: c_q c_k partial
           sums (fp32) in a buffer row of its own, which torch sums: no float atomics, so dw is
           reproducible.

Products and sums are in fp32; the outputs are in x's dtype, dw in the kernel's.
"""

import torch
import triton
import triton.language as tl

from .._launch import new, pow2
from .route import MAX_KERNEL, fits

# (BM, BN) of _stream (rows a program walks, keys wide) and of _dw's tiles: powers of two >= 16
TILES = {"stream": (64, 256), "dw": (64, 128)}


@triton.jit
def _zeros1(BN: tl.constexpr):
    return tl.zeros((BN,), dtype=tl.float32)


@triton.jit
def _zeros2(R: tl.constexpr, BN: tl.constexpr):
    return tl.zeros((R, BN), dtype=tl.float32)


@triton.jit
def _w(w_base, a, t, CK: tl.constexpr):
    return tl.load(w_base + a * CK + t)


@triton.jit
def _stream(x_ptr, w_ptr, y_ptr, H, Tq, Tk, CQ: tl.constexpr, CK: tl.constexpr, BM: tl.constexpr,
            BN: tl.constexpr, DIR: tl.constexpr):
    """DIR 1: y[r, j] = sum w[a, t] x[r - (CQ-1) + a, j + t - CK//2] (the forward); DIR -1: the same
    with rows and key shifts mirrored (dx from g). acc<k> is the output row k rows ahead of the input
    row just read (in the walk's direction); it takes that row's weights of kernel row CQ - 1 - k."""
    n_col = tl.cdiv(Tk, BN)
    pid, bh = tl.program_id(0), tl.program_id(1)
    first = (pid // n_col) * BM
    own = tl.minimum(BM, Tq - first)
    cols = (pid % n_col) * BN + tl.arange(0, BN)
    base = bh.to(tl.int64) * Tq * Tk
    w_base = w_ptr + (bh % H) * (CQ * CK)
    if DIR == 1:
        r0 = first - (CQ - 1)
    else:
        r0 = first + own - 1 + (CQ - 1)
    # one zeros each: Triton carries a variable through the loop only where its value changes, and
    # `acc5 = acc6` would not change acc5 if both started as the same tensor
    acc0, acc1, acc2, acc3 = _zeros1(BN), _zeros1(BN), _zeros1(BN), _zeros1(BN)
    acc4, acc5, acc6, acc7 = _zeros1(BN), _zeros1(BN), _zeros1(BN), _zeros1(BN)
    for k in range(0, own + CQ - 1):
        r = r0 + DIR * k
        rr = r + tl.zeros_like(cols)  # the row as a vector (the interpreter's scalar & vector gives ints)
        row_ok = (rr >= 0) & (rr < Tq)
        for t in tl.static_range(CK):
            c = cols + DIR * (t - CK // 2)
            xt = tl.load(x_ptr + base + r * Tk + c, mask=row_ok & (c >= 0) & (c < Tk), other=0.0).to(tl.float32)
            acc0 += _w(w_base, CQ - 1, t, CK) * xt
            if CQ > 1:
                acc1 += _w(w_base, CQ - 2, t, CK) * xt
            if CQ > 2:
                acc2 += _w(w_base, CQ - 3, t, CK) * xt
            if CQ > 3:
                acc3 += _w(w_base, CQ - 4, t, CK) * xt
            if CQ > 4:
                acc4 += _w(w_base, CQ - 5, t, CK) * xt
            if CQ > 5:
                acc5 += _w(w_base, CQ - 6, t, CK) * xt
            if CQ > 6:
                acc6 += _w(w_base, CQ - 7, t, CK) * xt
            if CQ > 7:
                acc7 += _w(w_base, CQ - 8, t, CK) * xt
        # row r has read all its inputs; the first CQ - 1 rows walked are the halo, not stored
        mine = (rr >= first) & (rr < first + own)
        tl.store(y_ptr + base + r * Tk + cols, acc0.to(y_ptr.dtype.element_ty), mask=mine & (cols < Tk))
        acc0, acc1, acc2, acc3, acc4, acc5, acc6 = acc1, acc2, acc3, acc4, acc5, acc6, acc7
        acc7 = _zeros1(BN)


@triton.jit
def _put(dw_base, a, p, tt, CK: tl.constexpr):
    tl.store(dw_base + a * CK + tt, tl.sum(p, axis=1), mask=tt < CK)


@triton.jit
def _dw(x_ptr, g_ptr, dw_ptr, Tq, Tk, CQ: tl.constexpr, CK: tl.constexpr, CKP: tl.constexpr, BM: tl.constexpr,
        BN: tl.constexpr):
    """Partial sums of dw over one program's rows of g (a row block, a key block): a walk down the
    rows of x, each read once as a [CKP, BN] tile of its CK key shifts, times the g rows it pairs
    with, held in registers (g<k>: g's row k below the x row, paired with kernel row CQ - 1 - k);
    p<k> sums those products elementwise, reduced over the keys at the end."""
    n_col = tl.cdiv(Tk, BN)
    pid, bh = tl.program_id(0), tl.program_id(1)
    first = (pid // n_col) * BM
    last = first + tl.minimum(BM, Tq - first)  # past the program's g rows
    cols = (pid % n_col) * BN + tl.arange(0, BN)
    tt = tl.arange(0, CKP)
    base = bh.to(tl.int64) * Tq * Tk
    cols2 = cols[None, :]
    shifted = cols2 + (tt[:, None] - CK // 2)
    keys_ok = (tt[:, None] < CK) & (shifted >= 0) & (shifted < Tk)
    p0, p1, p2, p3 = _zeros2(CKP, BN), _zeros2(CKP, BN), _zeros2(CKP, BN), _zeros2(CKP, BN)
    p4, p5, p6, p7 = _zeros2(CKP, BN), _zeros2(CKP, BN), _zeros2(CKP, BN), _zeros2(CKP, BN)
    # g's rows as [1, BN], in the layout of the products (a vector would be converted at every use)
    g0, g1, g2, g3 = _zeros2(1, BN), _zeros2(1, BN), _zeros2(1, BN), _zeros2(1, BN)  # one zeros each (_stream)
    g4, g5, g6, g7 = _zeros2(1, BN), _zeros2(1, BN), _zeros2(1, BN), _zeros2(1, BN)
    for r in range(first - (CQ - 1), last):
        below = r + (CQ - 1)  # g's row that enters the window: the program's, or past it (zero)
        gb = below + tl.zeros_like(cols2)  # as a tensor (the interpreter's scalar & tensor gives ints)
        new = tl.load(g_ptr + base + below * Tk + cols2, mask=(gb < last) & (cols2 < Tk), other=0.0).to(tl.float32)
        g0, g1, g2, g3, g4, g5, g6 = g1, g2, g3, g4, g5, g6, g7
        g7 = _zeros2(1, BN)
        if CQ == 1:
            g0 = new
        elif CQ == 2:
            g1 = new
        elif CQ == 3:
            g2 = new
        elif CQ == 4:
            g3 = new
        elif CQ == 5:
            g4 = new
        elif CQ == 6:
            g5 = new
        elif CQ == 7:
            g6 = new
        else:
            g7 = new
        rr = r + tl.zeros((CKP, BN), dtype=tl.int32)
        x = tl.load(x_ptr + base + r * Tk + shifted, mask=keys_ok & (rr >= 0), other=0.0).to(tl.float32)
        p0 += g0 * x
        if CQ > 1:
            p1 += g1 * x
        if CQ > 2:
            p2 += g2 * x
        if CQ > 3:
            p3 += g3 * x
        if CQ > 4:
            p4 += g4 * x
        if CQ > 5:
            p5 += g5 * x
        if CQ > 6:
            p6 += g6 * x
        if CQ > 7:
            p7 += g7 * x
    dw_base = dw_ptr + (bh.to(tl.int64) * tl.num_programs(0) + pid) * (CQ * CK)
    _put(dw_base, CQ - 1, p0, tt, CK)
    if CQ > 1:
        _put(dw_base, CQ - 2, p1, tt, CK)
    if CQ > 2:
        _put(dw_base, CQ - 3, p2, tt, CK)
    if CQ > 3:
        _put(dw_base, CQ - 4, p3, tt, CK)
    if CQ > 4:
        _put(dw_base, CQ - 5, p4, tt, CK)
    if CQ > 5:
        _put(dw_base, CQ - 6, p5, tt, CK)
    if CQ > 6:
        _put(dw_base, CQ - 7, p6, tt, CK)
    if CQ > 7:
        _put(dw_base, CQ - 8, p7, tt, CK)


def check_kernel(x: torch.Tensor, kernel: torch.Tensor):
    """One-line errors for what the kernels do not take (before any launch)."""
    if x.dim() != 4 or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be [B, H, Tq, Tk] in fp16/bf16/fp32, got {x.dtype} {tuple(x.shape)}")
    if kernel.dim() != 4 or kernel.shape[0] != x.shape[1] or kernel.shape[1] != 1:
        raise ValueError(f"kernel must be [H, 1, c_q, c_k] with H = {x.shape[1]}, got {tuple(kernel.shape)}")
    if not fits(*kernel.shape[-2:]):
        raise ValueError(f"the Triton MTA convolution takes kernels up to {MAX_KERNEL[0]} x {MAX_KERNEL[1]} "
                         f"with c_k odd, got {kernel.shape[-2]} x {kernel.shape[-1]}")


def _tiles(kind: str, Tq: int, Tk: int, tiles) -> tuple[int, int]:
    """(BM, BN) of one kernel: tiles[kind] or TILES', no larger than the map needs."""
    bm, bn = (tiles or {}).get(kind, TILES[kind])
    return min(bm, pow2(Tq)), min(bn, pow2(Tk))


def _walk(x, w, direction: int, tiles=None):
    """_stream over x (direction 1: y from x; -1: dx from g) -> a new tensor like x."""
    B, H, Tq, Tk = x.shape
    bm, bn = _tiles("stream", Tq, Tk, tiles)
    y = new(x.shape, x)
    grid = (triton.cdiv(Tq, bm) * triton.cdiv(Tk, bn), B * H)
    # two keys a thread (4 warps at BN 256): a warp's load of a shifted row is then 128 contiguous
    # bytes, and each weight it loads serves two products
    _stream[grid](x, w, y, H, Tq, Tk, *w.shape[-2:], bm, bn, direction, num_warps=max(1, min(4, bn // 64)))
    return y


def _weight_grad(x, g, c_q: int, c_k: int, tiles=None):
    """dw [H, c_q, c_k] in fp32: per-program partial sums, then a fixed-order sum (reproducible)."""
    B, H, Tq, Tk = x.shape
    bm, bn = _tiles("dw", Tq, Tk, tiles)
    grid = (triton.cdiv(Tq, bm) * triton.cdiv(Tk, bn), B * H)
    parts = new((B, H, grid[0], c_q * c_k), x, torch.float32)
    _dw[grid](x, g, parts, Tq, Tk, c_q, c_k, pow2(c_k, 1), bm, bn, num_warps=max(1, min(4, bn // 32)))
    return parts.sum((0, 2)).view(H, c_q, c_k)


class _Conv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, kernel, tiles):
        w = kernel.detach().float().contiguous()
        ctx.save_for_backward(x, w)
        ctx.kernel_dtype, ctx.tiles = kernel.dtype, tiles
        return _walk(x, w, 1, tiles)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        g = g.contiguous()
        dx = _walk(g, w, -1, ctx.tiles) if ctx.needs_input_grad[0] else None
        dw = _weight_grad(x, g, *w.shape[-2:], ctx.tiles) if ctx.needs_input_grad[1] else None
        return dx, None if dw is None else dw.view(w.shape).to(ctx.kernel_dtype), None


def mta_conv(x: torch.Tensor, kernel: torch.Tensor, tiles: dict | None = None) -> torch.Tensor:
    """x [B, H, Tq, Tk] (fp16/bf16/fp32) convolved per head by kernel [H, 1, c_q, c_k] (c_q <= 8, c_k
    <= 15 and odd; used in fp32) as reference._conv(x, kernel) does: zero padding, c_q - 1 rows above
    and c_k // 2 keys on either side. Differentiable in x and kernel; the output is x's dtype,
    contiguous. tiles (for tuning): {"stream": (BM, BN), "dw": (BM, BN)}, either or both, powers of
    two >= 16 (default TILES)."""
    check_kernel(x, kernel)
    for kind, tile in (tiles or {}).items():
        if kind not in TILES or len(tile) != 2 or any(b < 16 or b & (b - 1) for b in tile):
            raise ValueError(f"tiles must map stream and/or dw to (BM, BN), powers of two >= 16, got {tiles}")
    return _Conv.apply(x.contiguous(), kernel, tiles)
