"""reference.head_dot in one launch: out_h = sum over b, t, j of x y for x, y [B, H, T, d].

The rows (b, t) of a head are cut into `programs / H` chunks of whole tiles; a program reads its
chunk's [BR, d] tiles of x and y by their strides (contiguous, heads-last [B, T, H, d] or any other
layout: no copy), takes the products in fp32 and adds them into a [BR, d] fp32 accumulator, and
writes that accumulator's sum: one partial per (chunk, head). The partials are summed by one small
torch reduction. No atomics: the order of every sum is fixed, so the result is the same from run to
run whatever the scheduling.

Why: PyTorch writes the product x y (one more tensor of the inputs' size) and then reduces it over
dims (0, 2, 3), not the innermost; this reads x and y once and writes [H, chunks] numbers."""

import torch
import triton
import triton.language as tl

from .._launch import new, pow2
from .route import DTYPES

PROGRAMS = 512  # about four per SM of an H200 (132 SMs): enough loads in flight to stream both inputs


@triton.jit
def _head_dot_partials(x_ptr, y_ptr, out_ptr, x_sb, x_sh, x_st, x_sd, y_sb, y_sh, y_st, y_sd, T, R, PER,
                       D: tl.constexpr, DP: tl.constexpr, BR: tl.constexpr):
    c, h = tl.program_id(0), tl.program_id(1).to(tl.int64)  # int64: offsets past 2^31 elements
    j = tl.arange(0, DP)
    acc = tl.zeros([BR, DP], dtype=tl.float32)
    for start in range(0, PER, BR):  # PER: a whole number of tiles, so chunks never overlap
        r = c * PER + start + tl.arange(0, BR)  # the rows (b, t) flattened, t fastest
        b, t = (r // T).to(tl.int64), (r % T).to(tl.int64)
        inside = (r < R)[:, None] & (j < D)[None, :]
        xs = x_ptr + h * x_sh + (b * x_sb + t * x_st)[:, None] + (j * x_sd)[None, :]
        ys = y_ptr + h * y_sh + (b * y_sb + t * y_st)[:, None] + (j * y_sd)[None, :]
        x = tl.load(xs, mask=inside, other=0.0).to(tl.float32)
        y = tl.load(ys, mask=inside, other=0.0).to(tl.float32)
        acc += x * y
    tl.store(out_ptr + h * tl.num_programs(0) + c, tl.sum(acc))


def head_dot(x: torch.Tensor, y: torch.Tensor, *, programs: int = PROGRAMS, block_rows: int | None = None):
    """x, y [B, H, T, d] of one shape and dtype (fp16, bf16 or fp32; any strides) -> [H] fp32, the sum
    over b, t, d of x y with fp32 products and sums. programs: about how many programs to launch
    (a chunk of rows per program and head); block_rows: the rows of a tile (a power of two; default
    4096 / d's padded size)."""
    if x.dim() != 4 or x.shape != y.shape or x.dtype != y.dtype or x.dtype not in DTYPES:
        raise ValueError(f"x and y must be [B, H, T, d] of one shape and dtype (fp16, bf16 or fp32), got "
                         f"{tuple(x.shape)} {x.dtype}, {tuple(y.shape)} {y.dtype}")
    B, H, T, D = x.shape
    if x.numel() == 0:
        return torch.zeros(H, dtype=torch.float32, device=x.device)
    R, dp = B * T, pow2(D, 16)
    br = block_rows or max(1, 4096 // dp)
    tiles = triton.cdiv(R, br)
    per = triton.cdiv(tiles, max(1, min(tiles, programs // H))) * br  # rows per chunk, whole tiles
    chunks = triton.cdiv(R, per)
    partials = new((H, chunks), x, torch.float32)
    _head_dot_partials[(chunks, H)](x, y, partials, *x.stride(), *y.stride(), T, R, per, D, dp, br)
    return partials.sum(1)
