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


@triton.jit
def key_start(m0, rows, T, WIN, DOC, BN: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    """The first key tile (a multiple of BN) that a row of the query block `rows` (m0 its first) may see:
    0; with a window the tile of key m0 - WIN + 1; with documents (DOC: each token's document's first
    position, _launch.check_masks) not before the earliest document of the rows. The tiles before it
    are skipped: the cost grows with the window or the documents, not T."""
    lo = 0
    if HAS_W:
        lo = tl.maximum(m0 - WIN + 1, 0)
    if HAS_SEG:
        lo = tl.maximum(lo, tl.min(tl.load(DOC + rows, mask=rows < T, other=T), 0))
    return lo // BN * BN


@triton.jit
def query_end(n0, cols, T, WIN, LAST, BN: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    """For a key-owner kernel: one past the last row that may see a key of the block `cols` (n0 its
    first): T; with a window at most n0 + BN - 1 + WIN (row i sees keys j > i - WIN); with documents
    (LAST: each token's document's last position) one past the keys' latest document's last row."""
    hi = T
    if HAS_W:
        hi = tl.minimum(hi, n0 + BN - 1 + WIN)
    if HAS_SEG:
        hi = tl.minimum(hi, tl.max(tl.load(LAST + cols, mask=cols < T, other=0), 0) + 1)
    return hi


@triton.jit
def window_document(allowed, row, col, row_doc, DOC, T, WIN, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    """`allowed` narrowed to a window of WIN keys (key col visible from row iff row - WIN < col) and to
    the row's document (row_doc: its first position; DOC as in key_start). row, col and row_doc
    broadcast to allowed's shape ([rows, keys] or the transposed tiles' [keys, rows])."""
    if HAS_W:
        allowed = allowed & (col > row - WIN)
    if HAS_SEG:
        allowed = allowed & (tl.load(DOC + col, mask=col < T, other=-1) == row_doc)
    return allowed


@triton.jit
def key_tiles(m0, rows, T, WIN, DOC, BM: tl.constexpr, BN: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    """(lo, edge) for the key tiles below the diagonal block [m0, m0 + BM) (`rows`): a row sees none
    before lo (key_start); those in [lo, edge) need a mask (a window's edge crosses them; with
    documents, all), those in [edge, m0) none. Without masks (0, 0)."""
    lo = key_start(m0, rows, T, WIN, DOC, BN, HAS_W, HAS_SEG)
    edge = lo
    if HAS_W:  # keys >= m0 + BM - WIN are in every row's window
        edge = tl.minimum(tl.maximum((tl.maximum(m0 + BM - WIN, 0) + BN - 1) // BN * BN, lo), m0)
    if HAS_SEG:
        edge = m0
    return lo, edge
