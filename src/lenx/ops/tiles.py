"""Tile helpers shared by the flash-style Triton kernels."""

import triton
import triton.language as tl


@triton.jit
def key_tile(p, cols, T, MASK: tl.constexpr):
    """A [keys, d] tile of K or V at pointers p. MASK (the diagonal block's tiles): keys at or past
    T read as zero; the other tiles lie wholly inside [0, T) and load without a mask."""
    if MASK:
        x = tl.load(p, mask=(cols < T)[:, None], other=0.0)
    else:
        x = tl.load(p)
    return x
