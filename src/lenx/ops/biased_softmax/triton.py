"""Fused causal softmax attention with a per-distance bias table: the DAPE V2 kernel with its
processor switched off (Kerple, ALiBi, T5, or no bias at all).

    out = softmax_causal(Q K^T / sqrt(d) + table[h, i - j + T - 1]) V

Flash-attention layout: one program per (batch x head, query block), heavy blocks first; online
softmax in base 2 (log2(e) folded into the scale and the bias); key tiles below the diagonal block
unmasked, the diagonal block's masked; never a T x T tensor. The bias reaches the kernels as a band
(band.py): each tile's bias is one contiguous block load, not a per-element gather. Backward: a
key-owner kernel for dK/dV and a query-owner kernel for dQ and the table gradient (no locks; the
table gradient is summed per diagonal inside a tile first, by rotating each row of dS, so a tile
issues ~BM + BN atomic adds instead of BM * BN). For the Kerple log bias the dq kernel can give
its two per-head parameters their gradients directly instead (biased_attention's `kerple`),
which is cheaper than the per-diagonal sums; so for Kerple power. notes/kernels.md has the measurements.

ROWS (FoX, lenx.ops.forgetting): the bias is c_i - c_j of per-token values c [B, H, T] instead, each
tile's from two vector loads (_rows_ref, _bias_tile); the key-owner kernel also gives c its gradient.
"""

import math

import torch
import triton
import triton.language as tl

from .. import fastmath
from .._launch import LOG2E, check_qkv, check_table, dot_precision, new, new_like, strides
from ..tiles import key_tile
from .band import BAND_PAD, BAND_W, band_tile, build_band, tile_config


@triton.jit
def _rows_ref(c_h, m0, rows, T, ROWS: tl.constexpr):
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
def _bias_tile(band_t, off_t, cq, c_h, ref, cols, T, MASK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               W: tl.constexpr, RES16: tl.constexpr, ROWS: tl.constexpr):
    """The [BM, BN] bias tile, base 2: the band's (band.py), or with ROWS FoX's c_i - c_j from the
    rows' cq (_rows_ref) and the keys' c at c_h + cols, two vector loads."""
    if ROWS:
        if MASK:
            ck = tl.load(c_h + cols, mask=cols < T, other=ref)
        else:
            ck = tl.load(c_h + cols)
        x = cq[:, None] - ((ck - ref) * 1.4426950408889634)[None, :]
    else:
        x = band_tile(band_t, off_t, BM, BN, W, RES16)
    return x


@triton.jit
def _fwd_tile(q, kp, vp, band_t, off_t, cq, c_h, ref, m_i, l_i, acc, rows_c, cols, T, qk_scale,
              HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, MASK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              W: tl.constexpr, RES16: tl.constexpr, PREC: tl.constexpr):
    """One key tile of the online softmax, base 2 (qk_scale and the bias carry log2(e))."""
    k = key_tile(kp, cols, T, MASK)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    if MASK:
        # rows_c = min(row, T - 1): padding rows see every real key; keys past T are masked
        allowed = cols[None, :] <= rows_c[:, None]
        if HAS_BIAS:
            s += _bias_tile(band_t, off_t, cq, c_h, ref, cols, T, MASK, BM, BN, W, RES16, ROWS)
        s = tl.where(allowed, s, float("-inf"))
    elif HAS_BIAS:
        s += _bias_tile(band_t, off_t, cq, c_h, ref, cols, T, MASK, BM, BN, W, RES16, ROWS)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = key_tile(vp, cols, T, MASK)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _bias_fwd(Q, K, V, BAND, OFF, C, O, LSE,
              sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
              T, qk_scale,
              H: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, DH: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, W: tl.constexpr, PAD: tl.constexpr, RES16: tl.constexpr,
              PREC: tl.constexpr):
    """One program: BM query rows of one (batch, head). Key tiles strictly below the diagonal
    block need no mask; the BM // BN tiles of the diagonal block do. Heavy blocks launch first."""
    bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    b = bh // H
    h = bh % H
    m0 = pid_m * BM
    rows = m0 + tl.arange(0, BM)
    rmask = rows < T
    rows_c = tl.minimum(rows, T - 1)
    dd = tl.arange(0, DH)
    nn = tl.arange(0, BN)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=rmask[:, None], other=0.0)
    kp = K + b * skb + h * skh + nn[:, None] * skt + dd[None, :]
    vp = V + b * svb + h * svh + nn[:, None] * svt + dd[None, :]
    band_h = BAND + h * (T + 2 * PAD) * W + (m0 + PAD) * W  # band row of (m0, key block 0)
    off_h = OFF + h * (T + 2 * PAD) + m0 + PAD
    c_h = C + bh * T
    ref, cq = _rows_ref(c_h, m0, rows, T, ROWS)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, DH], tl.float32)
    for n0 in range(0, m0, BN):
        m_i, l_i, acc = _fwd_tile(q, kp + n0 * skt, vp + n0 * svt, band_h - n0 * W, off_h - n0, cq, c_h, ref,
                                  m_i, l_i, acc, rows_c, n0 + nn, T, qk_scale, HAS_BIAS, ROWS, False, BM, BN, W,
                                  RES16, PREC)
    # Key m0 (the diagonal block's first) is allowed for every row, padding rows too, so m_i is
    # finite after the first diagonal tile and exp2(m_i - m_new) never sees inf - inf.
    for n0 in range(m0, tl.minimum(m0 + BM, T), BN):
        m_i, l_i, acc = _fwd_tile(q, kp + n0 * skt, vp + n0 * svt, band_h - n0 * W, off_h - n0, cq, c_h, ref,
                                  m_i, l_i, acc, rows_c, n0 + nn, T, qk_scale, HAS_BIAS, ROWS, True, BM, BN, W,
                                  RES16, PREC)
    out = acc / l_i[:, None]
    tl.store(O + b * sob + h * soh + rows[:, None] * sot + dd[None, :], out.to(O.dtype.element_ty), mask=rmask[:, None])
    tl.store(LSE + bh * T + rows, m_i + tl.log2(l_i), mask=rmask)  # base 2


@triton.jit
def _dkdv_tile(k, v, qp, dop, band_t, off_t, c_h, ck, cref, lse_h, delta_h, dk, dv, dc, m0, cols, T, qk_scale,
               HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, MASK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               W: tl.constexpr, RES16: tl.constexpr, BAND_T: tl.constexpr, PAD: tl.constexpr, PREC: tl.constexpr):
    """Transposed tile [keys, queries] of the key-owner backward: query rows m0 .. m0 + BM. ROWS
    (FoX): ck = (the keys' c - cref) log2(e), cref their block's first c, and dc gathers the keys'
    c gradient, minus the column sums of dS."""
    rows = m0 + tl.arange(0, BM)
    rmask = rows < T
    q = tl.load(qp, mask=rmask[:, None], other=0.0)
    do = tl.load(dop, mask=rmask[:, None], other=0.0)
    lse = tl.load(lse_h + rows, mask=rmask, other=float("inf"))  # padding rows: p = 0
    delta = tl.load(delta_h + rows, mask=rmask, other=0.0)
    st = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale  # [BN, BM]
    if HAS_BIAS:
        if ROWS:  # less the key block's first c (cref), as precise as the rows' (c - cref is small for the keys)
            cq = (tl.load(c_h + rows, mask=rmask, other=cref) - cref) * 1.4426950408889634
            st += cq[None, :] - ck[:, None]
        elif BAND_T:  # the transposed band: the [keys, queries] tile is a plain block of it
            x = tl.load(band_t + tl.arange(0, BN)[:, None] * (T + 2 * PAD) + tl.arange(0, BM)[None, :])
            if RES16:
                x = x.to(tl.float32) + tl.load(off_t + tl.arange(0, BM))[None, :]
            st += x
        else:
            st += tl.trans(band_tile(band_t, off_t, BM, BN, W, RES16))
    if MASK:
        allowed = cols[:, None] <= tl.minimum(rows, T - 1)[None, :]  # padding rows have p = 0 anyway
        pt = tl.where(allowed, tl.exp2(st - lse[None, :]), 0.0)
    else:
        pt = tl.exp2(st - lse[None, :])
    dv += tl.dot(pt.to(do.dtype), do, input_precision=PREC)
    dpt = tl.dot(v, tl.trans(do), input_precision=PREC)
    dst = pt * (dpt - delta[None, :])
    dk += tl.dot(dst.to(q.dtype), q, input_precision=PREC)
    if ROWS:
        dc -= tl.sum(dst, 1)
    return dk, dv, dc


@triton.jit
def _bias_bwd_dkdv(Q, K, V, BAND, OFF, C, DO, LSE, DELTA, DK, DV, DC,
                   sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                   T, qk_scale, sm_scale,
                   H: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, DH: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, W: tl.constexpr, PAD: tl.constexpr, RES16: tl.constexpr,
                   BAND_T: tl.constexpr, PREC: tl.constexpr):
    """One program owns BN keys and walks the query blocks from its diagonal down: the BN // BM
    blocks that cross the diagonal with the causal mask, the rest without. Transposed tiles
    [keys, queries], so no register transposes. ROWS (FoX): also the keys' c gradient DC, whole
    here (one owner per key block, no atomics); the rows' part, the row sums of dS, is zero
    (sum_j P_ij (dP_ij - Delta_i) = Delta_i - Delta_i) and is left out."""
    bh = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = bh // H
    h = bh % H
    n0 = pid_n * BN
    cols = n0 + tl.arange(0, BN)
    cmask = cols < T
    dd = tl.arange(0, DH)
    mm = tl.arange(0, BM)
    k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dd[None, :], mask=cmask[:, None], other=0.0)
    v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + dd[None, :], mask=cmask[:, None], other=0.0)
    dk = tl.zeros([BN, DH], tl.float32)
    dv = tl.zeros([BN, DH], tl.float32)
    qp = Q + b * sqb + h * sqh + mm[:, None] * sqt + dd[None, :]
    dop = DO + b * sdb + h * sdh + mm[:, None] * sdt + dd[None, :]
    if BAND_T:  # band column of (query 0, this key block)
        band_h = BAND + h * (T + 2 * PAD) * W + (PAD - n0)
        band_step = 1
    else:  # band row of (query 0, this key block)
        band_h = BAND + h * (T + 2 * PAD) * W + (PAD - n0) * W
        band_step = W
    off_h = OFF + h * (T + 2 * PAD) + PAD - n0
    c_h = C + bh * T
    cref = 0.0
    ck = tl.zeros([BN], tl.float32)
    if ROWS:
        cref = tl.load(c_h + n0)
        ck = (tl.load(c_h + cols, mask=cmask, other=cref) - cref) * 1.4426950408889634
    dc = tl.zeros([BN], tl.float32)
    hi = tl.minimum(n0 + BN, T)
    for m0 in range(n0, hi, BM):
        dk, dv, dc = _dkdv_tile(k, v, qp + m0 * sqt, dop + m0 * sdt, band_h + m0 * band_step, off_h + m0, c_h, ck, cref,
                                LSE + bh * T, DELTA + bh * T, dk, dv, dc, m0, cols, T, qk_scale, HAS_BIAS, ROWS, True,
                                BM, BN, W, RES16, BAND_T, PAD, PREC)
    for m0 in range(hi, T, BM):
        dk, dv, dc = _dkdv_tile(k, v, qp + m0 * sqt, dop + m0 * sdt, band_h + m0 * band_step, off_h + m0, c_h, ck, cref,
                                LSE + bh * T, DELTA + bh * T, dk, dv, dc, m0, cols, T, qk_scale, HAS_BIAS, ROWS, False,
                                BM, BN, W, RES16, BAND_T, PAD, PREC)
    if ROWS:
        tl.store(DC + bh * T + cols, dc, mask=cmask)
    tl.store(DK + b * skb + h * skh + cols[:, None] * skt + dd[None, :], (dk * sm_scale).to(DK.dtype.element_ty), mask=cmask[:, None])
    tl.store(DV + b * svb + h * svh + cols[:, None] * svt + dd[None, :], dv.to(DV.dtype.element_ty), mask=cmask[:, None])


@triton.jit
def _dq_tile(q, do, lse, delta, kp, vp, band_t, off_t, cq, c_h, ref, DTAB_H, dq, g1, g2, r2, rows_c, cols, m0, n0,
             T, qk_scale, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, NEED_DTAB: tl.constexpr, KERPLE: tl.constexpr,
             TAIL_SUM: tl.constexpr, MASK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, W: tl.constexpr,
             RES16: tl.constexpr, PREC: tl.constexpr, HW: tl.constexpr):
    k = key_tile(kp, cols, T, MASK)
    v = key_tile(vp, cols, T, MASK)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    if HAS_BIAS:
        bias = _bias_tile(band_t, off_t, cq, c_h, ref, cols, T, MASK, BM, BN, W, RES16, ROWS)
        s += bias
    if MASK:
        allowed = cols[None, :] <= rows_c[:, None]
        p = tl.where(allowed, tl.exp2(s - lse[:, None]), 0.0)
    else:
        p = tl.exp2(s - lse[:, None])
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)
    ds = p * (dp - delta[:, None])
    dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    if NEED_DTAB:
        # rotate row r left by r (mod BN): column c' then holds distance j BN - c' in its rows
        # with (c' + r) // BN == j; one gather of the tile's size, BM // BN + 1 masked sums
        r = tl.arange(0, BM)[:, None]
        cc = tl.arange(0, BN)
        y = tl.gather(ds, (cc[None, :] + r) % BN, 1)
        wrap = (cc[None, :] + r) // BN
        for j in tl.static_range(BM // BN + 1):
            dist = m0 - n0 + j * BN - cc
            tl.atomic_add(DTAB_H + dist, tl.sum(tl.where(wrap == j, y, 0.0), 0),
                          mask=(dist >= 0) & (dist < T), sem="relaxed")
    if TAIL_SUM:  # a tile entirely in the table's constant tail: only its total is needed
        g1 += ds
    if KERPLE > 0:
        # The bias's two per-head parameters (x, y), its first derivative d bias / d x = bias / x
        # for both forms: accumulate dS * bias (the band tile, base 2) and dS * (the y-derivative
        # without its per-head factor) elementwise; the factors and the sums come once per program.
        # KERPLE 1, log: bias = -r1 ln(1 + r2 n), d bias / d r2 = -r1 n / (1 + r2 n)
        # KERPLE 2, power: bias = -a n^p, d bias / d p = bias ln n (bias = 0 at n = 0)
        n = tl.maximum((m0 - n0) + (tl.arange(0, BM)[:, None] - tl.arange(0, BN)[None, :]), 0).to(tl.float32)
        g1 += ds * bias
        if KERPLE == 1:
            g2 += ds * (n * fastmath.rcp(1.0 + r2 * n, HW))
        else:
            g2 += ds * (bias * fastmath.log2(tl.maximum(n, 1.0), HW))
    return dq, g1, g2


@triton.jit
def _bias_bwd_dq(Q, K, V, BAND, OFF, C, DO, LSE, DELTA, DQ, DTAB, R2, KG,
                 sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                 T, qk_scale, sm_scale, n_tail,
                 H: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, NEED_DTAB: tl.constexpr,
                 KERPLE: tl.constexpr, TAIL: tl.constexpr,
                 DH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, W: tl.constexpr, PAD: tl.constexpr,
                 RES16: tl.constexpr, PREC: tl.constexpr, HW: tl.constexpr):
    """One program owns a block of queries: dQ, and either the bias-table gradient (the table
    gradient of entry (i, j) is dS_ij itself, summed over each diagonal i - j, then atomically
    added) or, KERPLE (1 log, 2 power), the two sums that give the Kerple bias's two per-head
    parameters their gradients (KG [B H, 2]). TAIL (with the table gradient): the table is
    constant from distance n_tail on, so key tiles entirely beyond it add only their total, at
    n_tail (see biased_attention)."""
    bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    b = bh // H
    h = bh % H
    m0 = pid_m * BM
    rows = m0 + tl.arange(0, BM)
    rmask = rows < T
    rows_c = tl.minimum(rows, T - 1)
    dd = tl.arange(0, DH)
    nn = tl.arange(0, BN)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=rmask[:, None], other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdt + dd[None, :], mask=rmask[:, None], other=0.0)
    lse = tl.load(LSE + bh * T + rows, mask=rmask, other=float("inf"))  # padding rows: p = 0
    delta = tl.load(DELTA + bh * T + rows, mask=rmask, other=0.0)
    dq = tl.zeros([BM, DH], tl.float32)
    kp = K + b * skb + h * skh + nn[:, None] * skt + dd[None, :]
    vp = V + b * svb + h * svh + nn[:, None] * svt + dd[None, :]
    band_h = BAND + h * (T + 2 * PAD) * W + (m0 + PAD) * W
    off_h = OFF + h * (T + 2 * PAD) + m0 + PAD
    dtab_h = DTAB + h * (2 * T - 1) + T - 1
    c_h = C + bh * T
    ref, cq = _rows_ref(c_h, m0, rows, T, ROWS)
    g1 = tl.zeros([BM, BN], tl.float32)
    g2 = tl.zeros([BM, BN], tl.float32)
    r2 = tl.load(R2 + h) if KERPLE == 1 else 0.0
    near0 = 0
    if TAIL:
        # key tiles [0, near0) lie at distances >= n_tail from every row of this block
        x = m0 - n_tail - BN + 1
        near0 = tl.where(x >= 0, tl.minimum((x // BN + 1) * BN, m0), 0)
        for n0 in range(0, near0, BN):
            dq, g1, g2 = _dq_tile(q, do, lse, delta, kp + n0 * skt, vp + n0 * svt, band_h - n0 * W, off_h - n0,
                                  cq, c_h, ref, dtab_h, dq, g1, g2, r2, rows_c, n0 + nn, m0, n0, T, qk_scale,
                                  HAS_BIAS, ROWS, False, 0, True, False, BM, BN, W, RES16, PREC, HW)
    for n0 in range(near0, m0, BN):
        dq, g1, g2 = _dq_tile(q, do, lse, delta, kp + n0 * skt, vp + n0 * svt, band_h - n0 * W, off_h - n0, cq,
                              c_h, ref, dtab_h, dq, g1, g2, r2, rows_c, n0 + nn, m0, n0, T, qk_scale,
                              HAS_BIAS, ROWS, NEED_DTAB, KERPLE, False, False, BM, BN, W, RES16, PREC, HW)
    for n0 in range(m0, tl.minimum(m0 + BM, T), BN):
        dq, g1, g2 = _dq_tile(q, do, lse, delta, kp + n0 * skt, vp + n0 * svt, band_h - n0 * W, off_h - n0, cq,
                              c_h, ref, dtab_h, dq, g1, g2, r2, rows_c, n0 + nn, m0, n0, T, qk_scale,
                              HAS_BIAS, ROWS, NEED_DTAB, KERPLE, False, True, BM, BN, W, RES16, PREC, HW)
    if TAIL:
        tl.atomic_add(dtab_h + n_tail, tl.sum(tl.sum(g1, 1), 0), sem="relaxed")
    if KERPLE > 0:
        tl.atomic_add(KG + bh * 2, tl.sum(tl.sum(g1, 1), 0), sem="relaxed")
        tl.atomic_add(KG + bh * 2 + 1, tl.sum(tl.sum(g2, 1), 0), sem="relaxed")
    tl.store(DQ + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], (dq * sm_scale).to(DQ.dtype.element_ty), mask=rmask[:, None])


class BiasedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, c, kerple_kind, kerple_x, kerple_y, tail, cfg):
        """table: a per-distance bias table, or c: FoX's prefix sums [B, H, T] (the bias c_i - c_j),
        or neither."""
        # Inputs and their gradients share one contiguous layout (a strided view, e.g. q sliced out
        # of a fused qkv projection, is copied once: O(T) and cheap next to the attention itself).
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        B, H, T, DH = q.shape
        rows = c is not None
        c = c.detach().float().contiguous() if rows else q  # a dummy pointer when unused
        has_band = table is not None
        res16 = has_band and cfg["band"][0] == "fp16"
        # the kernels work in base 2: exp2(s * log2(e)) = exp(s), so the bias is scaled once here
        band, off = build_band(table, T, res16) if has_band else (q, q)  # dummy pointers when unused
        out = new((B, H, T, DH), q)
        lse = new((B, H, T), q, torch.float32)  # base 2
        BM, BN, nw, ns = cfg["fwd"]
        grid = (B * H, triton.cdiv(T, BM))
        _bias_fwd[grid](q, k, v, band, off, c, out, lse, *strides(q), *strides(k), *strides(v), *strides(out),
                        T, DH ** -0.5 * LOG2E, H=H, HAS_BIAS=has_band or rows, ROWS=rows, DH=DH, BM=BM, BN=BN,
                        W=BAND_W, PAD=BAND_PAD, RES16=res16, PREC=dot_precision(q.dtype), num_warps=nw, num_stages=ns)
        ctx.save_for_backward(q, k, v, band, off, c, out, lse, table if has_band else None, kerple_x, kerple_y)
        ctx.kerple_kind = kerple_kind
        ctx.tail = tail
        ctx.has_band, ctx.rows = has_band, rows
        ctx.res16 = res16
        ctx.cfg = cfg
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, band, off, c, out, lse, table, px, py = ctx.saved_tensors
        B, H, T, DH = q.shape
        cfg = ctx.cfg
        dout = dout.contiguous()
        delta = (dout.float() * out.float()).sum(-1).contiguous()  # rowsum(dO * O), [B, H, T]
        # Gradients are contiguous like the saved inputs, so the kernels reuse q/k/v strides for them.
        dq, dk, dv = new_like(q), new_like(k), new_like(v)
        prec = dot_precision(q.dtype)
        scale = DH ** -0.5
        # Kerple: the kernel sums the two parameters' gradients itself (two sums per program instead of
        # per-diagonal sums of the table gradient, which the table then would carry to them)
        kind = {"log": 1, "power": 2}[ctx.kerple_kind] if px is not None else 0
        kerple = kind if kind and (ctx.needs_input_grad[6] or ctx.needs_input_grad[7]) else 0
        need_dtab = ctx.has_band and ctx.needs_input_grad[3] and px is None
        dtab = torch.zeros(H, 2 * T - 1, dtype=torch.float32, device=q.device) if need_dtab else q
        kg = torch.zeros(B * H, 2, dtype=torch.float32, device=q.device) if kerple else q
        r2_f = py.detach().float().contiguous() if kerple == 1 else q
        BM, BN, nw, ns = cfg["dkdv"]
        band_t = cfg["dkdv_band"][0] == "T" and ctx.has_band
        kband = build_band(table, T, ctx.res16, trans=True)[0] if band_t else band  # the key-owner kernel's band
        dc = new((B, H, T), q, torch.float32) if ctx.rows else q
        has_bias = ctx.has_band or ctx.rows
        _bias_bwd_dkdv[(B * H, triton.cdiv(T, BN))](
            q, k, v, kband, off, c, dout, lse, delta, dk, dv, dc, *strides(q), *strides(k), *strides(v),
            *strides(dout), T, scale * LOG2E, scale, H=H, HAS_BIAS=has_bias, ROWS=ctx.rows, DH=DH, BM=BM, BN=BN,
            W=BAND_W, PAD=BAND_PAD, RES16=ctx.res16, BAND_T=band_t, PREC=prec, num_warps=nw, num_stages=ns)
        BM, BN, nw, ns = cfg["dq"]
        _bias_bwd_dq[(B * H, triton.cdiv(T, BM))](
            q, k, v, band, off, c, dout, lse, delta, dq, dtab, r2_f, kg, *strides(q), *strides(k), *strides(v),
            *strides(dout), T, scale * LOG2E, scale, ctx.tail or 0, H=H, HAS_BIAS=has_bias, ROWS=ctx.rows,
            NEED_DTAB=need_dtab, KERPLE=kerple,
            TAIL=need_dtab and ctx.tail is not None and ctx.tail < T, DH=DH,
            BM=BM, BN=BN, W=BAND_W, PAD=BAND_PAD, RES16=ctx.res16, PREC=prec, HW=q.is_cuda,
            num_warps=nw, num_stages=ns)
        dx = dy = None
        if kerple:  # see _dq_tile: sums of dS bias log2(e), and of dS n / (1 + r2 n) or dS bias log2(e) log2 n
            sums = kg.view(B, H, 2).sum(0)
            xf = px.detach().float()
            dx = (math.log(2.0) / xf * sums[:, 0]).to(px.dtype)
            dy = (-xf * sums[:, 1] if kerple == 1 else math.log(2.0) ** 2 * sums[:, 1]).to(py.dtype)
        return dq, dk, dv, (dtab if need_dtab else None), (dc if ctx.rows else None), None, dx, dy, None, None


def biased_attention(q, k, v, table=None, kerple=None, tail=None, config: dict | None = None):
    """Causal softmax attention of q, k, v [B, H, T, d] with an optional per-distance bias table
    [H, 2T - 1] (entry (i - j) + T - 1; see reference.py). Differentiable in all four; the table
    gradient flows on to whatever built the table.

    kerple: None, or ("log", r1, r2) / ("power", a, p): the Kerple bias the table holds,
    -r1 ln(1 + r2 |i - j|) or -a |i - j|^p, with its clamped per-head parameters ([H] each). Then
    the backward gives those two their gradients directly (cheaper than the table gradient) and the
    table gets none.

    tail: None, or a distance from which the table is constant (T5's last bucket, say) and only
    the sum of its gradient over those distances matters (it comes from one parameter per head).
    The table gradient then carries that sum at entry `tail` and zero beyond it: cheaper, and
    exact for whatever sums the table's entries from `tail` on, not entry by entry.

    config: tile settings over the defaults (band.py: CONFIG and tile_config), for tuning and tests."""
    check_qkv(q, k, v)
    H = q.shape[1]
    if table is not None:
        check_table(table, H, q.shape[2])
    kind = x = y = None
    if kerple is not None:
        kind, x, y = kerple
        if kind not in ("log", "power") or table is None or tuple(x.shape) != (H,) or tuple(y.shape) != (H,):
            raise ValueError(f"kerple must be ('log' or 'power', x, y) with the Kerple table and x, y of shape [{H}], "
                             f"got kind {kind!r}")
    if tail is not None and (table is None or kerple is not None or int(tail) < 1):
        raise ValueError(f"tail must be a distance >= 1 with a table and without kerple, got {tail!r}")
    cfg = tile_config(q.dtype, q.shape[-1], config)
    return BiasedAttention.apply(q, k, v, table, None, kind, x, y, None if tail is None else int(tail), cfg)
