"""Fused stick-breaking attention (Tan et al. 2024), forward and backward in log space.

    log A_ij = logsigmoid(z_ij) - sum_{j<l, l allowed} softplus(z_il),   z = q k^T / sqrt(d)
    out_i = sum_j A_ij v_j,   rem_i = exp(-L_i),   L_i = sum_j softplus(z_ij)  (allowed keys only)

Forward: one program per (batch x head, query block), heavy blocks first, walks key blocks from the
diagonal back to key 0, carrying each row's softplus sum over the blocks already seen (in fp64, see
below); only the diagonal block's tiles are masked. Inside a block the suffix sum is a
tensor-core product with a 0/1 triangle (see _scan); it includes the key itself, since
logsigmoid(z) - strict suffix = z - inclusive suffix. All sums are kept in base 2 (z log2(e)), so
each entry costs exp2, log2 and exp2: three MUFU ops. log2 is the hardware's lg2.approx
(tl.log2 compiles to a ~25-instruction routine; see lenx.ops.fastmath).

Backward: one program per query block walks the key blocks the other way, from key 0 up to the
diagonal, because the gradient needs prefix sums. With g_ij = A_ij (dO_i . v_j):

    dz_ij = g_ij (1 - beta_ij) - beta_ij (sum_{m<j} g_im + drem_i rem_i),   beta = sigmoid(z)
          = g_ij - beta_ij (g_ij + that sum)

The prefix sum of g is exact and tiny for far keys, which matters: any per-row error in it is
multiplied by sum_j beta_ij k_j over the whole row. A_ij is rebuilt from the forward's total
L_i minus the prefix of softplus; L_i and that prefix are kept in fp64 so the difference has no
cancellation error at long T. dK/dV belong to other programs: they are added with relaxed fp32
atomic adds (no locks; the summation order, and so the last bits, can vary between runs; timed
without them, the backward was no faster).
"""

import torch
import triton
import triton.language as tl

from .. import fastmath
from .._launch import LOG2E, check_masks, check_qkv, dot_precision, new, strides
from ..tiles import key_tile, key_tiles, window_document


@triton.jit
def _softplus_parts(qk, scale, HW: tl.constexpr):
    """(softplus(z), logsigmoid(z)) in base 2 (divided by ln 2) for z = qk scale / log2(e), i.e.
    scale = log2(e) / sqrt(d): two MUFU ops (exp2, log2); the scale is applied inside the other
    operations (no separate multiply per score)."""
    l1 = fastmath.log2(1.0 + tl.exp2(tl.abs(qk) * -scale), HW)  # log2(1 + e^-|z|)
    return tl.maximum(qk, 0.0) * scale + l1, tl.minimum(qk, 0.0) * scale - l1


@triton.jit
def _allowed(rows, cols, T, CURRENT: tl.constexpr, W, seg_r, SEG, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    """[rows, keys] entries of a masked tile that take part: keys before the row (or at it, CURRENT),
    inside [0, T), in rows inside [0, T); with HAS_W, inside the row's window of W keys; with
    HAS_SEG, of the row's document (seg_r the rows' documents, SEG this sequence's: each token's
    document's first position, _launch.check_masks)."""
    if CURRENT:
        allowed = cols[None, :] <= rows[:, None]
    else:
        allowed = cols[None, :] < rows[:, None]
    allowed = allowed & (cols < T)[None, :] & (rows < T)[:, None]
    return window_document(allowed, rows[:, None], cols[None, :], seg_r[:, None], SEG, T, W, HAS_W, HAS_SEG)


@triton.jit
def _window_tiles(m0, rows, T, W, SEG, BM: tl.constexpr, BN: tl.constexpr, HAS_W: tl.constexpr,
                  HAS_SEG: tl.constexpr):
    """The key tiles below the diagonal block [m0, m0 + BM) that a row of it sees: (first key, tiles,
    of which the `clear` nearest the diagonal need no mask). Without masks: all from key 0, all
    clear; a window, or documents, skip the tiles wholly before the earliest key a row sees (a
    row sees no key of an earlier document: cost O(W) or O(the documents), not O(T)) and mask
    the tiles that a row's edge crosses (with documents, all: tiles.key_tiles)."""
    first, edge = key_tiles(m0, rows, T, W, SEG, BM, BN, HAS_W, HAS_SEG)
    return first, (m0 - first) // BN, (m0 - edge) // BN


@triton.jit
def _tri(BN: tl.constexpr, KIND: tl.constexpr, SCAN_MM: tl.constexpr, PREC: tl.constexpr):
    """[BN, BN] 0/1 matrix M for x @ M along the rows of x: KIND "suffix" (M[a, c] = a > c: strict
    suffix sums), "suffix_incl" (a >= c: inclusive suffix sums) or "prefix" (a < c: strict prefix)."""
    a = tl.arange(0, BN)[:, None]
    c = tl.arange(0, BN)[None, :]
    if KIND == "suffix_incl":
        m = tl.where(a >= c, 1.0, 0.0)
    elif KIND == "suffix":
        m = tl.where(a > c, 1.0, 0.0)
    else:
        m = tl.where(a < c, 1.0, 0.0)
    if PREC != "ieee":
        if SCAN_MM == 2:
            m = m.to(tl.float16)
        else:
            m = m.to(tl.bfloat16)
    return m


@triton.jit
def _scan(x, M, KIND: tl.constexpr, SCAN_MM: tl.constexpr, PREC: tl.constexpr):
    """Prefix or suffix sums along the rows of x [BM, BN], fp32 (KIND and M as in _tri). SCAN_MM: as a
    tensor-core product with a 0/1 triangle M. SCAN_MM = 1: x split into two bf16 parts x = hi + lo
    (~16 mantissa bits: the sums are good to ~1e-5 of the magnitudes summed); SCAN_MM = 2: one fp16
    product (11 bits: ~2.4e-4 of the magnitudes summed). SCAN_MM = 0: tl.cumsum."""
    if SCAN_MM > 0:
        if PREC == "ieee":
            out = tl.dot(x, M, input_precision="ieee")
        elif SCAN_MM == 2:
            out = tl.dot(x.to(tl.float16), M)
        else:
            hi = x.to(tl.bfloat16)
            lo = (x - hi.to(tl.float32)).to(tl.bfloat16)
            out = tl.dot(hi, M)
            out = tl.dot(lo, M, out)
    elif KIND == "suffix_incl":
        out = tl.cumsum(x, 1, reverse=True)
    else:
        out = tl.cumsum(x, 1, reverse=KIND == "suffix") - x
    return out


@triton.jit
def _sb_fwd_tile(q, kp, vp, acc, carry, U, rows, cols, T, qk_scale, W, seg_r, SEG,
                 CURRENT: tl.constexpr, MASK: tl.constexpr, SCAN_MM: tl.constexpr, PREC: tl.constexpr,
                 HW: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    """One key tile, walking towards key 0. All sums in base-2 units (log2 of the weights)."""
    qk = tl.dot(q, tl.trans(key_tile(kp, cols, T, MASK)), input_precision=PREC)
    sp, _ = _softplus_parts(qk, qk_scale, HW)
    if MASK:
        allowed = _allowed(rows, cols, T, CURRENT, W, seg_r, SEG, HAS_W, HAS_SEG)
        sp = tl.where(allowed, sp, 0.0)
    # log2 A = logsigmoid(z) - strict suffix = z - inclusive suffix (logsigmoid = z - softplus): two
    # fewer operations per score; the fp16 scan now also rounds the key's own softplus (measured:
    # out error 2.8e-3 instead of 1.8e-3 with logits scaled 8x, results/bench/README.md)
    suffix = _scan(sp, U, "suffix_incl", SCAN_MM, PREC) + carry.to(tl.float32)[:, None]
    a = tl.exp2(qk * qk_scale - suffix)
    if MASK:
        a = tl.where(allowed, a, 0.0)
    v = key_tile(vp, cols, T, MASK)
    acc += tl.dot(a.to(v.dtype), v, input_precision=PREC)
    carry += tl.sum(sp, 1).to(tl.float64)
    return acc, carry


@triton.jit
def _sb_fwd(Q, K, V, O, REM, LTOT, SEGS,
            sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
            T, qk_scale, W,
            H: tl.constexpr, DH: tl.constexpr, CURRENT: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, SCAN_MM: tl.constexpr, PREC: tl.constexpr,
            HW: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    """One program: BM rows. The BM // BN tiles of the diagonal block (masked), then the tiles
    below it (no masks but at a window's edge or with documents: padding rows compute garbage that
    is never stored). Heavy blocks first."""
    bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    b = bh // H
    h = bh % H
    m0 = pid_m * BM
    rows = m0 + tl.arange(0, BM)
    rmask = rows < T
    dd = tl.arange(0, DH)
    nn = tl.arange(0, BN)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=rmask[:, None], other=0.0)
    kp = K + b * skb + h * skh + nn[:, None] * skt + dd[None, :]
    vp = V + b * svb + h * svh + nn[:, None] * svt + dd[None, :]
    acc = tl.zeros([BM, DH], tl.float32)
    carry = tl.zeros([BM], tl.float64)  # softplus sum over the keys already walked (nearer the diagonal)
    U = _tri(BN, "suffix_incl", SCAN_MM, PREC)
    SEG = SEGS + b * T
    seg_r = rows
    if HAS_SEG:
        seg_r = tl.load(SEG + rows, mask=rmask, other=-1)
    n_diag = tl.cdiv(tl.minimum(m0 + BM, T) - m0, BN)
    for it in range(0, n_diag):
        n0 = m0 + (n_diag - 1 - it) * BN
        acc, carry = _sb_fwd_tile(q, kp + n0 * skt, vp + n0 * svt, acc, carry, U, rows, n0 + nn, T, qk_scale,
                                  W, seg_r, SEG, CURRENT, True, SCAN_MM, PREC, HW, HAS_W, HAS_SEG)
    first, tiles, clear = _window_tiles(m0, rows, T, W, SEG, BM, BN, HAS_W, HAS_SEG)
    for it in range(0, clear):
        n0 = m0 - (it + 1) * BN
        acc, carry = _sb_fwd_tile(q, kp + n0 * skt, vp + n0 * svt, acc, carry, U, rows, n0 + nn, T, qk_scale,
                                  W, seg_r, SEG, CURRENT, False, SCAN_MM, PREC, HW, HAS_W, HAS_SEG)
    for it in range(clear, tiles):
        n0 = m0 - (it + 1) * BN
        acc, carry = _sb_fwd_tile(q, kp + n0 * skt, vp + n0 * svt, acc, carry, U, rows, n0 + nn, T, qk_scale,
                                  W, seg_r, SEG, CURRENT, True, SCAN_MM, PREC, HW, HAS_W, HAS_SEG)
    tl.store(O + b * sob + h * soh + rows[:, None] * sot + dd[None, :], acc.to(O.dtype.element_ty), mask=rmask[:, None])
    tl.store(REM + bh * T + rows, tl.exp2(-carry.to(tl.float32)), mask=rmask)
    tl.store(LTOT + bh * T + rows, carry, mask=rmask)  # base 2


@triton.jit
def _sb_bwd_tile(q, do, kp, vp, DKP, DVP, total, pre_sp, pre_g, dq, U, L, rows, cols, T, qk_scale, sm_scale,
                 W, seg_r, SEG, CURRENT: tl.constexpr, MASK: tl.constexpr, SCAN_MM: tl.constexpr,
                 PREC: tl.constexpr, HW: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    k = key_tile(kp, cols, T, MASK)
    v = key_tile(vp, cols, T, MASK)
    da = tl.dot(do, tl.trans(v), input_precision=PREC)  # first: independent of the chain below
    sp, logsig = _softplus_parts(tl.dot(q, tl.trans(k), input_precision=PREC), qk_scale, HW)
    if MASK:
        allowed = _allowed(rows, cols, T, CURRENT, W, seg_r, SEG, HAS_W, HAS_SEG)
        sp = tl.where(allowed, sp, 0.0)
    blk = tl.sum(sp, 1)
    # softplus sum past this block (padding rows: total = +inf, so a = 0 there)
    after = (total - pre_sp - blk.to(tl.float64)).to(tl.float32)
    suffix = _scan(sp, U, "suffix", SCAN_MM, PREC) + after[:, None]
    a = tl.exp2(logsig - suffix)
    if MASK:
        a = tl.where(allowed, a, 0.0)
    g = a * da
    # strict prefix sum of g plus drem rem (pre_g starts at it)
    prefix = _scan(g, L, "prefix", SCAN_MM, PREC) + pre_g[:, None]
    dz = g - tl.exp2(logsig) * (g + prefix)  # g (1 - beta) - beta (prefix + drem rem)
    if MASK:
        dz = tl.where(allowed, dz, 0.0)
    dq += tl.dot(dz.to(k.dtype), k, input_precision=PREC)
    dk_part = tl.dot(tl.trans(dz).to(q.dtype), q, input_precision=PREC) * sm_scale
    dv_part = tl.dot(tl.trans(a).to(do.dtype), do, input_precision=PREC)
    if MASK:
        tl.atomic_add(DKP, dk_part, mask=(cols < T)[:, None], sem="relaxed")
        tl.atomic_add(DVP, dv_part, mask=(cols < T)[:, None], sem="relaxed")
    else:
        tl.atomic_add(DKP, dk_part, sem="relaxed")
        tl.atomic_add(DVP, dv_part, sem="relaxed")
    pre_sp += blk.to(tl.float64)
    pre_g += tl.sum(g, 1)
    return dq, pre_sp, pre_g


@triton.jit
def _sb_bwd(Q, K, V, DO, DREM, REM, LTOT, DQ, DK, DV, SEGS,
            sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
            T, qk_scale, sm_scale, W,
            H: tl.constexpr, DH: tl.constexpr, CURRENT: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, SCAN_MM: tl.constexpr, PREC: tl.constexpr,
            HW: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    """One program: BM rows, key tiles from the first one a row sees up (masked at a window's edge
    or with documents, else not), then the diagonal block's (masked)."""
    bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    b = bh // H
    h = bh % H
    m0 = pid_m * BM
    rows = m0 + tl.arange(0, BM)
    rmask = rows < T
    dd = tl.arange(0, DH)
    nn = tl.arange(0, BN)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=rmask[:, None], other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdt + dd[None, :], mask=rmask[:, None], other=0.0)
    total = tl.load(LTOT + bh * T + rows, mask=rmask, other=float("inf"))  # fp64, base 2
    pre_sp = tl.zeros([BM], tl.float64)  # softplus sum over the keys before this block
    # drem rem plus the sum of g over the keys before this block
    pre_g = tl.load(DREM + bh * T + rows, mask=rmask, other=0.0) * tl.load(REM + bh * T + rows, mask=rmask, other=0.0)
    dq = tl.zeros([BM, DH], tl.float32)
    U = _tri(BN, "suffix", SCAN_MM, PREC)
    L = _tri(BN, "prefix", SCAN_MM, PREC)
    kp = K + b * skb + h * skh + nn[:, None] * skt + dd[None, :]
    vp = V + b * svb + h * svh + nn[:, None] * svt + dd[None, :]
    kv = bh * T * DH + nn[:, None] * DH + dd[None, :]  # DK, DV: contiguous fp32 buffers
    SEG = SEGS + b * T
    seg_r = rows
    if HAS_SEG:
        seg_r = tl.load(SEG + rows, mask=rmask, other=-1)
    first, tiles, clear = _window_tiles(m0, rows, T, W, SEG, BM, BN, HAS_W, HAS_SEG)
    edge = first + (tiles - clear) * BN  # the masked tiles are the farthest from the diagonal
    for n0 in range(first, edge, BN):
        dq, pre_sp, pre_g = _sb_bwd_tile(q, do, kp + n0 * skt, vp + n0 * svt, DK + kv + n0 * DH, DV + kv + n0 * DH,
                                         total, pre_sp, pre_g, dq, U, L, rows, n0 + nn, T, qk_scale, sm_scale,
                                         W, seg_r, SEG, CURRENT, True, SCAN_MM, PREC, HW, HAS_W, HAS_SEG)
    for n0 in range(edge, m0, BN):
        dq, pre_sp, pre_g = _sb_bwd_tile(q, do, kp + n0 * skt, vp + n0 * svt, DK + kv + n0 * DH, DV + kv + n0 * DH,
                                         total, pre_sp, pre_g, dq, U, L, rows, n0 + nn, T, qk_scale, sm_scale,
                                         W, seg_r, SEG, CURRENT, False, SCAN_MM, PREC, HW, HAS_W, HAS_SEG)
    for n0 in range(m0, tl.minimum(m0 + BM, T), BN):
        dq, pre_sp, pre_g = _sb_bwd_tile(q, do, kp + n0 * skt, vp + n0 * svt, DK + kv + n0 * DH, DV + kv + n0 * DH,
                                         total, pre_sp, pre_g, dq, U, L, rows, n0 + nn, T, qk_scale, sm_scale,
                                         W, seg_r, SEG, CURRENT, True, SCAN_MM, PREC, HW, HAS_W, HAS_SEG)
    tl.store(DQ + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], (dq * sm_scale).to(DQ.dtype.element_ty), mask=rmask[:, None])


# (BM, BN, num_warps, num_stages); BM a multiple of BN. "scan": the in-block prefix/suffix sums,
# "mm" two bf16 tensor-core products (hi/lo split), "mm16" one fp16 product, "cumsum" tl.cumsum.
# H200, T 8192, fwd / fwd+bwd ms: cumsum 1.67 / 5.47 vs mm 1.01 / 3.69 in one run; mm 0.97 / 3.43
# vs mm16 0.87 / 2.91 in a later one (results/bench/h200_session2_sweeps.json)
CONFIG = {"fwd": (64, 32, 4, 4), "bwd": (128, 64, 8, 3), "scan": ("mm16",)}
CONFIG_FP32 = {"fwd": (32, 32, 4, 1), "bwd": (32, 32, 4, 1), "scan": ("mm",)}  # exact fp32 products: a testing path
_SCANS = {"cumsum": 0, "mm": 1, "mm16": 2}


def tile_config(dtype, overrides: dict | None = None) -> dict:
    """The tiles one call uses: the defaults for its dtype with `overrides` on top."""
    cfg = dict(CONFIG_FP32 if dtype == torch.float32 else CONFIG)
    cfg.update({k: tuple(v) for k, v in (overrides or {}).items()})
    if set(cfg) != set(CONFIG) or cfg["scan"][0] not in _SCANS:
        raise ValueError(f"stick-breaking tile settings take {sorted(CONFIG)} with scan in {sorted(_SCANS)}, "
                         f"got {overrides}")
    return cfg


class StickBreakingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, attend_current, cfg, window, spans):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        segs = spans[0] if spans is not None else q  # a pointer the kernel never reads
        B, H, T, DH = q.shape
        out = new(q.shape, q)
        rem = new((B, H, T), q, torch.float32)
        total = new((B, H, T), q, torch.float64)  # base 2
        BM, BN, nw, ns = cfg["fwd"]
        _sb_fwd[(B * H, triton.cdiv(T, BM))](
            q, k, v, out, rem, total, segs, *strides(q), *strides(k), *strides(v), *strides(out),
            T, DH ** -0.5 * LOG2E, window, H=H, DH=DH, CURRENT=bool(attend_current), BM=BM, BN=BN,
            SCAN_MM=_SCANS[cfg["scan"][0]], PREC=dot_precision(q.dtype), HW=q.is_cuda, HAS_W=window > 0,
            HAS_SEG=spans is not None, num_warps=nw, num_stages=ns)
        ctx.save_for_backward(q, k, v, rem, total, segs)
        ctx.window, ctx.has_seg = window, spans is not None
        ctx.attend_current = bool(attend_current)
        ctx.cfg = cfg
        ctx.mark_non_differentiable(total)
        return out, rem

    @staticmethod
    def backward(ctx, dout, drem):
        q, k, v, rem, total, segs = ctx.saved_tensors
        B, H, T, DH = q.shape
        dout = torch.zeros_like(q) if dout is None else dout.contiguous()
        drem = torch.zeros_like(rem) if drem is None else drem.float().contiguous()
        dq = new(q.shape, q)
        # dK/dV are summed over query blocks by atomic adds: they must start at zero.
        dk = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dv = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        BM, BN, nw, ns = ctx.cfg["bwd"]
        _sb_bwd[(B * H, triton.cdiv(T, BM))](
            q, k, v, dout, drem, rem, total, dq, dk, dv, segs,
            *strides(q), *strides(k), *strides(v), *strides(dout),
            T, DH ** -0.5 * LOG2E, DH ** -0.5, ctx.window, H=H, DH=DH, CURRENT=ctx.attend_current, BM=BM, BN=BN,
            SCAN_MM=_SCANS[ctx.cfg["scan"][0]], PREC=dot_precision(q.dtype), HW=q.is_cuda, HAS_W=ctx.window > 0,
            HAS_SEG=ctx.has_seg, num_warps=nw, num_stages=ns)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def stickbreaking_triton(q, k, v, attend_current: bool = False, config: dict | None = None, window: int = 0,
                         segments: torch.Tensor | None = None):
    """Stick-breaking attention, q, k, v [B, H, T, d] (d in 16/32/64/128) -> (out, rem), as
    reference.stickbreaking_reference (out in v's dtype, rem fp32), with its window (0: none) and
    document ids segments [B, T]. config: tile settings over the defaults (see CONFIG), for tuning
    and tests."""
    check_qkv(q, k, v)
    window, spans = check_masks(window, segments, q.shape[0], q.shape[2], q.device)
    return StickBreakingAttention.apply(q, k, v, attend_current, tile_config(q.dtype, config), window, spans)
