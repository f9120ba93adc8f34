"""The per-distance bias as a band (see build_band): built once per call from the [H, 2T - 1] table, read
by the biased-softmax kernels one contiguous tile at a time; and the kernels' tile shapes, which
the band bounds (tile_config)."""

import torch
import triton
import triton.language as tl

# Every key tile is at most BAND_W wide and every query tile at most BAND_PAD tall.
BAND_W = 64
BAND_PAD = 128


@triton.jit
def _band_build(TAB, BAND, OFF, T, RES16: tl.constexpr, W: tl.constexpr, PAD: tl.constexpr, RB: tl.constexpr,
                TRANS: tl.constexpr):
    """Fills RB rows of one head's band from the [H, 2T - 1] table (see build_band). TRANS: the band
    transposed instead, [H, W, T + 2 PAD] (the offsets are not written again)."""
    h = tl.program_id(0)
    rr = tl.program_id(1) * RB + tl.arange(0, RB)  # band rows; distance of (row, c) = rr - PAD - c
    cc = tl.arange(0, W)
    rok = rr < T + 2 * PAD
    tab_h = TAB + h * (2 * T - 1)
    idx = tl.minimum(tl.maximum(rr[:, None] - PAD - cc[None, :] + T - 1, 0), 2 * T - 2)
    x = tl.load(tab_h + idx, mask=rok[:, None], other=0.0) * 1.4426950408889634  # log2(e)
    if TRANS:
        ptr = BAND + h * (T + 2 * PAD) * W + cc[None, :] * (T + 2 * PAD) + rr[:, None]
    else:
        ptr = BAND + h * (T + 2 * PAD) * W + rr[:, None] * W + cc[None, :]
    if RES16:
        # residuals against the row's largest bias: the entries that matter (large logits) get small
        # residuals, and a residual's fp16 error (2^-11 of it) only grows where the weight 2^residual
        # falls away (a steep bias, Kerple power say, would lose the near keys' precision otherwise)
        off = tl.max(x, 1)
        if not TRANS:
            tl.store(OFF + h * (T + 2 * PAD) + rr, off, mask=rok)
        res = tl.minimum(tl.maximum(x - off[:, None], -60000.0), 60000.0)
        tl.store(ptr, res.to(tl.float16), mask=rok[:, None])
    else:
        tl.store(ptr, x, mask=rok[:, None])


@triton.jit
def band_tile(band_t, off_t, BM: tl.constexpr, BN: tl.constexpr, W: tl.constexpr, RES16: tl.constexpr):
    """The [BM, BN] bias tile of a (query block, key block) pair: rows of the band (see build_band)
    starting at the pair's offset m0 - n0; a plain 2D block load (no gather). RES16: the band
    holds fp16 residuals against a per-row fp32 offset."""
    x = tl.load(band_t + tl.arange(0, BM)[:, None] * W + tl.arange(0, BN)[None, :])
    if RES16:
        x = x.to(tl.float32) + tl.load(off_t + tl.arange(0, BM))[:, None]
    return x


@triton.jit
def rows_ref(c_h, m0, rows, T, ROWS: tl.constexpr):
    """FoX (ROWS): (ref, cq), ref = c at the query block's first row m0 and cq = (c[rows] - ref)
    log2(e). Taking ref from both c's before they are scaled keeps fp32's precision near the
    diagonal, the entries that weigh, where c itself is large (about -0.7 t at position t)."""
    ref = 0.0
    cq = tl.zeros(rows.shape, tl.float32)
    if ROWS:
        ref = tl.load(c_h + m0)
        cq = (tl.load(c_h + rows, mask=rows < T, other=ref) - ref) * 1.4426950408889634
    return ref, cq


@triton.jit
def bias_tile(band_t, off_t, cq, c_h, ref, cols, T, MASK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               W: tl.constexpr, RES16: tl.constexpr, ROWS: tl.constexpr):
    """The [BM, BN] bias tile, base 2: the band's (band.py), or with ROWS FoX's c_i - c_j from the
    rows' cq (rows_ref) and the keys' c at c_h + cols, two vector loads."""
    if ROWS:
        if MASK:
            ck = tl.load(c_h + cols, mask=cols < T, other=ref)
        else:
            ck = tl.load(c_h + cols)
        x = cq[:, None] - ((ck - ref) * 1.4426950408889634)[None, :]
    else:
        x = band_tile(band_t, off_t, BM, BN, W, RES16)
    return x


def build_band(table, T, res16, trans=False):
    """The bias as a band [H, T + 2 PAD, W] (times log2(e)): band[h, PAD + R, c] is the bias at
    distance R - c. The [BM, BN] bias tile of query block m0 and key block n0 is then the plain
    2D block of rows PAD + m0 - n0 .. + BM and columns 0 .. BN: one contiguous load per tile
    instead of a per-element gather from the [H, 2T - 1] table. Distances outside [0, T) (masked
    entries, padding rows) read the nearest table entry: finite values that are never used.
    res16: fp16 residuals against the largest bias of each row (an fp32 offset per row). A
    residual r <= 0 (base 2) is kept to 2^-11 |r|, and its entry weighs at most 2^r of the row's
    largest, so the error in P stays below ~2e-4 (the order of rounding P to bf16 for the PV
    product) whatever the table's steepness, with half the bytes: the kernels are bound by the
    band's traffic. Otherwise (always for fp32 inputs) the bias itself in fp32. Returns (band,
    offsets); size H (T + 256) 64 x 2 bytes: 13 MB at H 12, T 8192.
    trans: the band transposed, [H, W, T + 2 PAD] (and no offsets)."""
    H = table.shape[0]
    tab = table.detach().float().contiguous()
    rows = T + 2 * BAND_PAD
    shape = (H, BAND_W, rows) if trans else (H, rows, BAND_W)
    band = torch.empty(shape, device=tab.device, dtype=torch.float16 if res16 else torch.float32)
    off = torch.empty(H, rows, device=tab.device, dtype=torch.float32) if res16 and not trans else band
    RB = 64
    _band_build[(H, triton.cdiv(rows, RB))](tab, band, off, T, RES16=res16, W=BAND_W, PAD=BAND_PAD, RB=RB,
                                            TRANS=trans, num_warps=4)
    return band, off


# Tile shapes: (BM, BN, num_warps, num_stages). fwd/dq: BM query rows, BN keys per tile (BM a
# multiple of BN); dkdv: BM query rows per tile, BN keys owned (BN a multiple of BM). Every key
# tile is at most BAND_W wide and every query tile at most BAND_PAD tall (the band, build_band).
# "band": "fp16" residuals or "fp32" values (see build_band); "dkdv_band": "T" the key-owner kernel reads
# a transposed copy of the band (built in the backward), "trans" it transposes the band tile in
# registers. The fastest candidates of scripts/tune/tile_sweep.py on an H200 at T = 8192 (results/bench/).
CONFIG = {"fwd": (64, 64, 4, 3), "dkdv": (64, 64, 4, 3), "dq": (64, 32, 4, 3), "band": ("fp16",),
          "dkdv_band": ("T",)}
# fp32 inputs (exact fp32 products, a testing path): small tiles, no pipelining
CONFIG_FP32 = {"fwd": (64, 32, 4, 1), "dkdv": (32, 64, 4, 1), "dq": (32, 32, 4, 1), "band": ("fp32",),
               "dkdv_band": ("T",)}
# Head dims above 64 (bf16/fp16): tiles that replace CONFIG's (d = 128 doubles every [*, d] tile).
# H200, d 128, T 8192 (results/bench/README.md): forward 0.547 vs 0.698 ms with CONFIG's
# 64 x 64 x 4; key-owner 32 x 64 x 4: fwd+bwd 2.97 vs 3.60 ms (64 x 64 x 4 spills there)
CONFIG_WIDE = {"fwd": (128, 64, 8, 3), "dkdv": (32, 64, 4, 3)}


def tile_config(dtype, head_dim: int = 64, overrides: dict | None = None) -> dict:
    """The tiles one call uses: the defaults for its dtype and head dim, with `overrides` (any of
    CONFIG's keys) on top. Checked against the band's limits."""
    if dtype == torch.float32:
        cfg = dict(CONFIG_FP32)
    else:
        cfg = {**CONFIG, **CONFIG_WIDE} if head_dim > 64 else dict(CONFIG)
    cfg.update({k: tuple(v) for k, v in (overrides or {}).items()})
    unknown = set(cfg) - set(CONFIG)
    if unknown:
        raise ValueError(f"unknown tile settings {sorted(unknown)}; known: {sorted(CONFIG)}")
    for name in ("fwd", "dkdv", "dq"):
        BM, BN = cfg[name][:2]
        keys, rows = (BM, BN) if name == "dkdv" else (BN, BM)
        if keys > BAND_W or rows > BAND_PAD:
            raise ValueError(f"{name} tiles {BM} x {BN}: key tiles must be <= {BAND_W}, query tiles <= {BAND_PAD}")
    return cfg
