"""The biased-softmax kernels' backward (triton.py has the forward, the autograd Function and the
entry): a key-owner kernel for dK/dV (and FoX's dc) and a query-owner kernel for dQ and the bias
table's gradient, or Kerple's two parameters'. Masks as in the forward (triton.py's docstring)."""

import triton
import triton.language as tl

from .. import fastmath
from ..tiles import key_tile, key_tiles, query_end, window_document
from .band import band_tile, bias_tile, rows_ref


@triton.jit
def _dkdv_tile(k, v, qp, dop, band_t, off_t, c_h, ck, cref, f_h, lse_h, delta_h, dk, dv, dc, m0, cols, T, qk_scale,
               WIN, DOC, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, MASK: tl.constexpr, BM: tl.constexpr,
               BN: tl.constexpr, W: tl.constexpr, RES16: tl.constexpr, BAND_T: tl.constexpr, PAD: tl.constexpr,
               PREC: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr, HAS_QF: tl.constexpr):
    """Transposed tile [keys, queries] of the key-owner backward: query rows m0 .. m0 + BM. ROWS
    (FoX): ck = (the keys' c - cref) log2(e), cref their block's first c, and dc gathers the keys'
    c gradient, minus the column sums of dS. HAS_QF: the rows' factors f_h[t] scale their scores,
    and dK takes the scaled rows, dS f q."""
    rows = m0 + tl.arange(0, BM)
    rmask = rows < T
    q = tl.load(qp, mask=rmask[:, None], other=0.0)
    do = tl.load(dop, mask=rmask[:, None], other=0.0)
    lse = tl.load(lse_h + rows, mask=rmask, other=float("inf"))  # padding rows: p = 0
    delta = tl.load(delta_h + rows, mask=rmask, other=0.0)
    if HAS_QF:
        fq = tl.load(f_h + rows, mask=rmask, other=0.0)
        st = tl.dot(k, tl.trans(q), input_precision=PREC) * (qk_scale * fq[None, :])  # [BN, BM]
    else:
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
        if HAS_W or HAS_SEG:
            doc_q = rows
            if HAS_SEG:
                doc_q = tl.load(DOC + rows, mask=rmask, other=-2)
            allowed = window_document(allowed, rows[None, :], cols[:, None], doc_q[None, :], DOC, T, WIN, HAS_W,
                                      HAS_SEG)
        pt = tl.where(allowed, tl.exp2(st - lse[None, :]), 0.0)
    else:
        pt = tl.exp2(st - lse[None, :])
    dv += tl.dot(pt.to(do.dtype), do, input_precision=PREC)
    dpt = tl.dot(v, tl.trans(do), input_precision=PREC)
    dst = pt * (dpt - delta[None, :])
    if HAS_QF:
        dk += tl.dot((dst * fq[None, :]).to(q.dtype), q, input_precision=PREC)
    else:
        dk += tl.dot(dst.to(q.dtype), q, input_precision=PREC)
    if ROWS:
        dc -= tl.sum(dst, 1)
    return dk, dv, dc


@triton.jit
def _bias_bwd_dkdv(Q, K, V, BAND, OFF, C, QF, DO, LSE, DELTA, DK, DV, DC,
                   sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt, sfb, sfh,
                   T, qk_scale, sm_scale, DOCS, LASTS, WIN,
                   H: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, DH: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, W: tl.constexpr, PAD: tl.constexpr, RES16: tl.constexpr,
                   BAND_T: tl.constexpr, PREC: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr,
                   HAS_QF: tl.constexpr):
    """One program owns BN keys and walks the query blocks from its diagonal down: the BN // BM
    blocks that cross the diagonal with the causal mask, the rest without. Transposed tiles
    [keys, queries], so no register transposes. ROWS (FoX): also the keys' c gradient DC, whole
    here (one owner per key block, no atomics); the rows' part, the row sums of dS, is zero
    (sum_j P_ij (dP_ij - Delta_i) = Delta_i - Delta_i) and is left out. Masks: the query blocks
    after the last row that sees these keys are skipped, those a window's edge crosses masked
    (with documents, all)."""
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
    f_h = QF + b * sfb + h * sfh
    cref = 0.0
    ck = tl.zeros([BN], tl.float32)
    if ROWS:
        cref = tl.load(c_h + n0)
        ck = (tl.load(c_h + cols, mask=cmask, other=cref) - cref) * 1.4426950408889634
    dc = tl.zeros([BN], tl.float32)
    hi = tl.minimum(n0 + BN, T)
    DOC = DOCS + b * T
    mid = T  # query blocks [hi, mid) need no mask, [mid, end) do
    end = T
    if HAS_W or HAS_SEG:
        end = query_end(n0, cols, T, WIN, LASTS + b * T, BN, HAS_W, HAS_SEG)
        mid = hi
        if HAS_W and not HAS_SEG:  # blocks from m0 <= n0 + WIN - BM on see every key of this one
            mid = tl.minimum(tl.maximum(n0 + (tl.maximum(WIN - BM + 1, 0) + BM - 1) // BM * BM, hi), end)
    for m0 in range(n0, hi, BM):
        dk, dv, dc = _dkdv_tile(k, v, qp + m0 * sqt, dop + m0 * sdt, band_h + m0 * band_step, off_h + m0, c_h, ck, cref,
                                f_h, LSE + bh * T, DELTA + bh * T, dk, dv, dc, m0, cols, T, qk_scale, WIN, DOC,
                                HAS_BIAS, ROWS, True, BM, BN, W, RES16, BAND_T, PAD, PREC, HAS_W, HAS_SEG, HAS_QF)
    for m0 in range(hi, mid, BM):
        dk, dv, dc = _dkdv_tile(k, v, qp + m0 * sqt, dop + m0 * sdt, band_h + m0 * band_step, off_h + m0, c_h, ck, cref,
                                f_h, LSE + bh * T, DELTA + bh * T, dk, dv, dc, m0, cols, T, qk_scale, WIN, DOC,
                                HAS_BIAS, ROWS, False, BM, BN, W, RES16, BAND_T, PAD, PREC, HAS_W, HAS_SEG, HAS_QF)
    if HAS_W or HAS_SEG:
        for m0 in range(mid, end, BM):
            dk, dv, dc = _dkdv_tile(k, v, qp + m0 * sqt, dop + m0 * sdt, band_h + m0 * band_step, off_h + m0, c_h, ck,
                                    cref, f_h, LSE + bh * T, DELTA + bh * T, dk, dv, dc, m0, cols, T, qk_scale, WIN,
                                    DOC, HAS_BIAS, ROWS, True, BM, BN, W, RES16, BAND_T, PAD, PREC, HAS_W, HAS_SEG,
                                    HAS_QF)
    if ROWS:
        tl.store(DC + bh * T + cols, dc, mask=cmask)
    tl.store(DK + b * skb + h * skh + cols[:, None] * skt + dd[None, :], (dk * sm_scale).to(DK.dtype.element_ty), mask=cmask[:, None])
    tl.store(DV + b * svb + h * svh + cols[:, None] * svt + dd[None, :], dv.to(DV.dtype.element_ty), mask=cmask[:, None])


@triton.jit
def _dq_tile(q, do, lse, delta, kp, vp, band_t, off_t, cq, c_h, ref, DTAB_H, dq, g1, g2, r2, rows_c, cols, m0, n0,
             T, qk_scale, WIN, doc_r, DOC, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, NEED_DTAB: tl.constexpr,
             KERPLE: tl.constexpr, TAIL_SUM: tl.constexpr, MASK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
             W: tl.constexpr, RES16: tl.constexpr, PREC: tl.constexpr, HW: tl.constexpr, HAS_W: tl.constexpr,
             HAS_SEG: tl.constexpr):
    k = key_tile(kp, cols, T, MASK)
    v = key_tile(vp, cols, T, MASK)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    if HAS_BIAS:
        bias = bias_tile(band_t, off_t, cq, c_h, ref, cols, T, MASK, BM, BN, W, RES16, ROWS)
        s += bias
    if MASK:
        allowed = cols[None, :] <= rows_c[:, None]
        allowed = window_document(allowed, rows_c[:, None], cols[None, :], doc_r[:, None], DOC, T, WIN, HAS_W, HAS_SEG)
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
def _bias_bwd_dq(Q, K, V, BAND, OFF, C, QF, DO, LSE, DELTA, DQ, DF, DTAB, R2, KG,
                 sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt, sfb, sfh,
                 T, qk_scale, sm_scale, n_tail, DOCS, WIN,
                 H: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, NEED_DTAB: tl.constexpr,
                 KERPLE: tl.constexpr, TAIL: tl.constexpr,
                 DH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, W: tl.constexpr, PAD: tl.constexpr,
                 RES16: tl.constexpr, PREC: tl.constexpr, HW: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr,
                 HAS_QF: tl.constexpr, NEED_DF: tl.constexpr):
    """One program owns a block of queries: dQ, and either the bias-table gradient (the table
    gradient of entry (i, j) is dS_ij itself, summed over each diagonal i - j, then atomically
    added) or, KERPLE (1 log, 2 power), the two sums that give the Kerple bias's two per-head
    parameters their gradients (KG [B H, 2]). TAIL (with the table gradient): the table is
    constant from distance n_tail on, so key tiles entirely beyond it add only their total, at
    n_tail (see biased_attention). Masks: the key tiles as in the forward (_key_tiles). HAS_QF:
    the rows' factors scale their scores (folded into the scale, as in the forward), and dQ, the
    gradient in the unscaled rows, is f dS K; NEED_DF: each row's factor gets its gradient too,
    the row's dS K . q, into DF [B H, T] (one owner per row: no atomics)."""
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
    dq_scale = sm_scale
    if HAS_QF:  # padding rows: row T - 1's factor (their dS is 0)
        f = tl.load(QF + b * sfb + h * sfh + rows_c)[:, None]
        qk_scale = qk_scale * f
        dq_scale = sm_scale * f
    dq = tl.zeros([BM, DH], tl.float32)
    kp = K + b * skb + h * skh + nn[:, None] * skt + dd[None, :]
    vp = V + b * svb + h * svh + nn[:, None] * svt + dd[None, :]
    band_h = BAND + h * (T + 2 * PAD) * W + (m0 + PAD) * W
    off_h = OFF + h * (T + 2 * PAD) + m0 + PAD
    dtab_h = DTAB + h * (2 * T - 1) + T - 1
    c_h = C + bh * T
    ref, cq = rows_ref(c_h, m0, rows, T, ROWS)
    g1 = tl.zeros([BM, BN], tl.float32)
    g2 = tl.zeros([BM, BN], tl.float32)
    r2 = tl.load(R2 + h) if KERPLE == 1 else 0.0
    DOC = DOCS + b * T
    lo, edge = key_tiles(m0, rows, T, WIN, DOC, BM, BN, HAS_W, HAS_SEG)
    doc_r = tl.load(DOC + rows_c) if HAS_SEG else rows_c  # padding rows: row T - 1's, as rows_c
    near0 = lo
    if TAIL:
        # key tiles [lo, near0) lie at distances >= n_tail from every row of this block (masked with
        # masks: a window's edge or another document may cross them)
        x = m0 - n_tail - BN + 1
        near0 = tl.where(x >= 0, tl.minimum((x // BN + 1) * BN, m0), 0)
        if HAS_W or HAS_SEG:
            near0 = tl.maximum(near0, lo)
        for n0 in range(lo, near0, BN):
            dq, g1, g2 = _dq_tile(q, do, lse, delta, kp + n0 * skt, vp + n0 * svt, band_h - n0 * W, off_h - n0,
                                  cq, c_h, ref, dtab_h, dq, g1, g2, r2, rows_c, n0 + nn, m0, n0, T, qk_scale, WIN,
                                  doc_r, DOC, HAS_BIAS, ROWS, False, 0, True, HAS_W or HAS_SEG, BM, BN, W, RES16,
                                  PREC, HW, HAS_W, HAS_SEG)
    start = near0
    if HAS_W or HAS_SEG:  # masked tiles below the diagonal block: [near0, edge)
        start = tl.maximum(near0, edge)
        for n0 in range(near0, start, BN):
            dq, g1, g2 = _dq_tile(q, do, lse, delta, kp + n0 * skt, vp + n0 * svt, band_h - n0 * W, off_h - n0,
                                  cq, c_h, ref, dtab_h, dq, g1, g2, r2, rows_c, n0 + nn, m0, n0, T, qk_scale, WIN,
                                  doc_r, DOC, HAS_BIAS, ROWS, NEED_DTAB, KERPLE, False, True, BM, BN, W, RES16, PREC,
                                  HW, HAS_W, HAS_SEG)
    for n0 in range(start, m0, BN):
        dq, g1, g2 = _dq_tile(q, do, lse, delta, kp + n0 * skt, vp + n0 * svt, band_h - n0 * W, off_h - n0, cq,
                              c_h, ref, dtab_h, dq, g1, g2, r2, rows_c, n0 + nn, m0, n0, T, qk_scale, WIN, doc_r, DOC,
                              HAS_BIAS, ROWS, NEED_DTAB, KERPLE, False, False, BM, BN, W, RES16, PREC, HW, HAS_W,
                              HAS_SEG)
    for n0 in range(m0, tl.minimum(m0 + BM, T), BN):
        dq, g1, g2 = _dq_tile(q, do, lse, delta, kp + n0 * skt, vp + n0 * svt, band_h - n0 * W, off_h - n0, cq,
                              c_h, ref, dtab_h, dq, g1, g2, r2, rows_c, n0 + nn, m0, n0, T, qk_scale, WIN, doc_r, DOC,
                              HAS_BIAS, ROWS, NEED_DTAB, KERPLE, False, True, BM, BN, W, RES16, PREC, HW, HAS_W,
                              HAS_SEG)
    if TAIL:
        tl.atomic_add(dtab_h + n_tail, tl.sum(tl.sum(g1, 1), 0), sem="relaxed")
    if KERPLE > 0:
        tl.atomic_add(KG + bh * 2, tl.sum(tl.sum(g1, 1), 0), sem="relaxed")
        tl.atomic_add(KG + bh * 2 + 1, tl.sum(tl.sum(g2, 1), 0), sem="relaxed")
    if NEED_DF:  # the gradient in the scaled rows, dS K / sqrt(d), dotted with the unscaled ones
        tl.store(DF + bh * T + rows, tl.sum(dq * sm_scale * q.to(tl.float32), 1), mask=rmask)
    tl.store(DQ + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], (dq * dq_scale).to(DQ.dtype.element_ty),
             mask=rmask[:, None])
