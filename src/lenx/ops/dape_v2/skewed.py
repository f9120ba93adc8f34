"""DAPE V2 for training: the score map through T x T buffers, the conv in (query, distance) tiles.

    out = softmax_causal(S + Bias + f(tril([S; Bias]))) V,   S = Q K^T / sqrt(d)

Rewrite A (reference.dape_v2_tables) turns the bias channels into per-distance tables, so the conv
sees only the H score channels: with m = i - j the distance,
    Y(i, m) = t1[m] - k0[key < h] + sum_t W1_t X(i, m + h - t),  X = tril(S) (0 outside 0 <= m <= i)
    Z = LeakyReLU(Y) (0 where the key i - m lies outside [0, T)),  F(i, m) = sum_u W2_u Z(i, m + h - u)
    logits = S + F + t2[m]                                          (h = k // 2)

Kernels, one job each (every product a plain tl.dot):
  _scores     S -> S buffer [B, H, T, T] (per head, causal tiles only)
  _conv_fwd   S buffer -> F buffer: a program owns a band of BN distances and walks the query rows;
              a tile is BM rows x BN distances ("pairs"), all heads at once: conv1 at centre e is
              [pairs, taps x head slots] @ [taps x slots, hidden] over the S buffer read at key
              offsets (a tap is an address offset, no register shifts); conv2 reads conv1 at the
              2h + 1 centres it needs (recomputed: conv1 is cheap)
  _attn_fwd   flash attention with logits Q K^T / sqrt(d) + F + t2 -> out, lse
  _attn_bwd   key owner: G = dL/dlogits -> G buffer, dV
  _conv_bwd   G and S buffers -> dS buffer (G plus the conv's gradient to S), and the gradients of
              W1, W2 and the tables: per-distance sums are column sums that the band's program
              keeps in registers while it walks the rows; no atomics, partials summed on the host
  _dq, _dk    dQ = dS K, dK = dS^T Q from the dS buffer (query owner and key owner: deterministic)
Tiles are indexed (row, distance) but a tile's distances run in descending order, so its keys
ascend and every row of a tile is one contiguous run of each buffer. The buffers hold only the
causal triangle (the rest is never written or read). The forward may keep the S and F buffers
for the backward (keep=True) or the backward recomputes them (memory).
"""

import torch
import triton
import triton.language as tl

from .._launch import LOG2E, check_qkv, dot_precision, new, new_like, pow2, strides

LN2 = 0.6931471805599453


# --- (query, distance) tiles -----------------------------------------------------------------------

@triton.jit
def _pairs(i0, n0, BM: tl.constexpr, BN: tl.constexpr):
    """Rows i, distances n and keys j of a tile's BM * BN pairs (row-major; distances descend)."""
    p = tl.arange(0, BM * BN)
    i = i0 + p // BN
    n = n0 + BN - 1 - p % BN
    return i, n, i - n


@triton.jit
def _taps(BUF, plane0, i, j, T, SIGN: tl.constexpr, H: tl.constexpr, HP: tl.constexpr,
          KS: tl.constexpr, KP: tl.constexpr, TRANS: tl.constexpr = False):
    """[pairs, KP] tile (TRANS: [KP, pairs]): column t * HP + s holds head s of the buffer at (row i,
    key j + SIGN (t - h)), zero outside the causal triangle (0 <= key <= i), for padded taps t >= KS
    and slots s >= H. TRANS loads the transposed tile from memory: a dot operand transposed in
    registers gave wrong weight gradients on the H100 (triton 3.6) at KP 128 or hidden 64."""
    col = tl.arange(0, KP)
    t = col // HP
    s = col % HP
    if TRANS:
        key = j[None, :] + SIGN * (t[:, None] - KS // 2)
        ok = (t < KS)[:, None] & (s < H)[:, None] & (key >= 0) & (key <= i[None, :]) & (i < T)[None, :]
        ptr = BUF + (plane0 + s.to(tl.int64) * T * T)[:, None] + i[None, :] * T + key
    else:
        key = j[:, None] + SIGN * (t[None, :] - KS // 2)
        ok = (t < KS)[None, :] & (s < H)[None, :] & (key >= 0) & (key <= i[:, None]) & (i < T)[:, None]
        ptr = BUF + (plane0 + s.to(tl.int64) * T * T)[None, :] + i[:, None] * T + key
    return tl.load(ptr, mask=ok, other=0.0)


@triton.jit
def _heads(BUF, plane0, i, j, T, H: tl.constexpr, HP: tl.constexpr):
    """[pairs, HP] tile of the buffer at (i, j) for every head (zero outside the causal triangle)."""
    s = tl.arange(0, HP)
    ok = (s < H)[None, :] & ((j >= 0) & (j <= i) & (i < T))[:, None]
    return tl.load(BUF + (plane0 + s.to(tl.int64) * T * T)[None, :] + (i * T + j)[:, None], mask=ok, other=0.0)


@triton.jit
def _hidden(SB, plane0, T1, K0, W1C, i, n, j, e, T, H: tl.constexpr, HP: tl.constexpr, KS: tl.constexpr,
            KP: tl.constexpr, DP: tl.constexpr, CDT: tl.constexpr, PREC: tl.constexpr):
    """conv1 at centre e (pairs (i, n + e), keys j - e): X [pairs, KP] (its input), y [pairs, DP]
    (pre-activation) and where its key lies in [0, T) (conv2's zero padding elsewhere)."""
    HALF: tl.constexpr = KS // 2
    jc = j - e
    m = n + e
    cc = tl.arange(0, DP)
    x = _taps(SB, plane0, i, jc, T, 1, H, HP, KS, KP)
    w1 = tl.load(W1C + tl.arange(0, KP)[:, None] * DP + cc[None, :])
    y = tl.dot(x.to(CDT), w1, input_precision=PREC)
    inside = (m >= 1 - T) & (m <= T - 1)  # t1 holds distances -(T - 1) .. T - 1; others are never used
    y += tl.load(T1 + (m + T - 1)[:, None] * DP + cc[None, :], mask=inside[:, None], other=0.0)
    if HALF > 0:
        # keys j < h read conv1's zero padding where the table t1 assumed bias entries
        near = (jc >= 0) & (jc < HALF) & (i < T)
        y -= tl.load(K0 + (jc * T + i)[:, None] * DP + cc[None, :], mask=near[:, None], other=0.0)
    keyok = (jc >= 0) & (jc < T)
    return x, y, keyok


@triton.jit
def _conv_fwd(SB, FB, T1, K0, W1C, W2T, T,
              H: tl.constexpr, HP: tl.constexpr, KS: tl.constexpr, KP: tl.constexpr, DP: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, CDT: tl.constexpr, PREC: tl.constexpr):
    """F = conv2(LeakyReLU(conv1(X))) for one band of BN distances, walking its rows."""
    HALF: tl.constexpr = KS // 2
    band = tl.num_programs(0) - 1 - tl.program_id(0)  # low distances (long walks) first
    b = tl.program_id(1)
    n0 = band * BN
    plane0 = (b * H).to(tl.int64) * T * T
    cc = tl.arange(0, DP)
    ss = tl.arange(0, HP)
    for i0 in range((n0 // BM) * BM, T, BM):
        i, n, j = _pairs(i0, n0, BM, BN)
        f = tl.zeros((BM * BN, HP), tl.float32)
        for u in tl.static_range(KS):
            e = HALF - u
            x, y, keyok = _hidden(SB, plane0, T1, K0, W1C, i, n, j, e, T, H, HP, KS, KP, DP, CDT, PREC)
            z = tl.where(keyok[:, None], tl.where(y > 0, y, 0.01 * y), 0.0)
            w2 = tl.load(W2T + u * DP * HP + cc[:, None] * HP + ss[None, :])
            f += tl.dot(z.to(CDT), w2, input_precision=PREC)
        ok = (ss < H)[None, :] & ((n >= 0) & (n <= i) & (i < T))[:, None]
        tl.store(FB + (plane0 + ss.to(tl.int64) * T * T)[None, :] + (i * T + j)[:, None],
                 f.to(FB.dtype.element_ty), mask=ok)


@triton.jit
def _conv_bwd(SB, GB, DSB, T1, K0, W1C, W1T, W2C, DW1, DW2, DT1, DK0, DT2, T,
              H: tl.constexpr, HP: tl.constexpr, KS: tl.constexpr, KP: tl.constexpr, DP: tl.constexpr,
              KSP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CDT: tl.constexpr, PREC: tl.constexpr):
    """Backward through the conv for one band of distances, walking its rows: dS = G + conv^T(G)
    restricted to the causal triangle, and this program's share of dW1, dW2 and the tables.

    conv1's output at (row, distance m) is counted once in the weight and table gradients: by the
    tile whose own distances hold m (centre 0), and m = -h .. -1 (keys right of the diagonal, which
    conv2 reads) by the first band's distance-0 pairs at centre e = m. Both weight gradients pair
    conv1's side at m with what it met there: dW1 = X_taps(m)^T dY(m), dW2^T = G_taps(m)^T Z(m)."""
    HALF: tl.constexpr = KS // 2
    band = tl.num_programs(0) - 1 - tl.program_id(0)
    b = tl.program_id(1)
    prog = b * tl.num_programs(0) + band
    n0 = band * BN
    plane0 = (b * H).to(tl.int64) * T * T
    cc = tl.arange(0, DP)
    ss = tl.arange(0, HP)
    kk = tl.arange(0, KP)
    uu = tl.arange(0, KSP)
    w2c = tl.load(W2C + kk[:, None] * DP + cc[None, :])
    dw1 = tl.zeros((KP, DP), tl.float32)
    dw2 = tl.zeros((KP, DP), tl.float32)
    dt1 = tl.zeros((BN, DP), tl.float32)
    dneg = tl.zeros((KSP, DP), tl.float32)  # row h + e: distance e < 0
    dt2 = tl.zeros((BN, HP), tl.float32)
    for i0 in range((n0 // BM) * BM, T, BM):
        i, n, j = _pairs(i0, n0, BM, BN)
        g0 = _heads(GB, plane0, i, j, T, H, HP)
        dx = tl.zeros((BM * BN, HP), tl.float32)
        for t in tl.static_range(KS):
            e = t - HALF  # dX(m) takes conv1 tap t's share of dY(m + e)
            x, y, keyok = _hidden(SB, plane0, T1, K0, W1C, i, n, j, e, T, H, HP, KS, KP, DP, CDT, PREC)
            gcat = _taps(GB, plane0, i, j - e, T, -1, H, HP, KS, KP)
            dz = tl.dot(gcat.to(CDT), w2c, input_precision=PREC)
            dy = tl.where(keyok[:, None], tl.where(y > 0, dz, 0.01 * dz), 0.0)
            w1t = tl.load(W1T + t * DP * HP + cc[:, None] * HP + ss[None, :])
            dx += tl.dot(dy.to(CDT), w1t, input_precision=PREC)
            if e == 0:
                z = tl.where(keyok[:, None], tl.where(y > 0, y, 0.01 * y), 0.0)
                xt = _taps(SB, plane0, i, j, T, 1, H, HP, KS, KP, True)
                gt = _taps(GB, plane0, i, j, T, -1, H, HP, KS, KP, True)
                dw1 += tl.dot(xt.to(CDT), dy.to(CDT), input_precision=PREC)
                dw2 += tl.dot(gt.to(CDT), z.to(CDT), input_precision=PREC)
                dt1 += tl.sum(tl.reshape(dy, (BM, BN, DP)), 0)
                if HALF > 0:
                    near = (i < T) & (j >= 0) & (j < HALF)
                    tl.store(DK0 + ((b * HALF + j) * T + i)[:, None] * DP + cc[None, :], -dy, mask=near[:, None])
            elif e < 0:
                if band == 0:  # the negative distances: pairs at distance 0 of the first band
                    own = (n == 0) & (i < T)
                    dyo = tl.where(own[:, None], dy, 0.0)
                    z = tl.where((own & keyok)[:, None], tl.where(y > 0, y, 0.01 * y), 0.0)
                    xt = _taps(SB, plane0, i, j - e, T, 1, H, HP, KS, KP, True)
                    gt = _taps(GB, plane0, i, j - e, T, -1, H, HP, KS, KP, True)
                    dw1 += tl.dot(xt.to(CDT), dyo.to(CDT), input_precision=PREC)
                    dw2 += tl.dot(gt.to(CDT), z.to(CDT), input_precision=PREC)
                    dneg += tl.where((uu == t)[:, None], tl.sum(dyo, 0)[None, :], 0.0)
                    if HALF > 0:
                        jc = j - e
                        near = own & (jc < HALF)
                        tl.store(DK0 + ((b * HALF + jc) * T + i)[:, None] * DP + cc[None, :], -dy, mask=near[:, None])
        causal = (n >= 0) & (n <= i) & (i < T)
        ds = g0 + tl.where(causal[:, None], dx, 0.0)
        tl.store(DSB + (plane0 + ss.to(tl.int64) * T * T)[None, :] + (i * T + j)[:, None],
                 ds.to(DSB.dtype.element_ty), mask=(ss < H)[None, :] & causal[:, None])
        dt2 += tl.sum(tl.reshape(g0.to(tl.float32), (BM, BN, HP)), 0)
    tl.store(DW1 + prog * KP * DP + kk[:, None] * DP + cc[None, :], dw1)
    tl.store(DW2 + prog * KP * DP + kk[:, None] * DP + cc[None, :], dw2)
    nn = n0 + BN - 1 - tl.arange(0, BN)
    tl.store(DT1 + (b * (2 * T - 1) + nn + T - 1)[:, None] * DP + cc[None, :], dt1, mask=(nn < T)[:, None])
    tl.store(DT2 + (b * T + nn)[:, None] * HP + ss[None, :], dt2, mask=(nn < T)[:, None])
    if band == 0:
        m = uu - HALF
        tl.store(DT1 + (b * (2 * T - 1) + m + T - 1)[:, None] * DP + cc[None, :], dneg,
                 mask=((m < 0) & (m >= -HALF) & (m >= 1 - T))[:, None])  # the table holds |m| < T


# --- per-head flash kernels -----------------------------------------------------------------------

@triton.jit
def _scores(Q, K, SB, sqb, sqh, sqt, skb, skh, skt, T, scale,
            H: tl.constexpr, DH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    """S = Q K^T / sqrt(d) into the S buffer, tiles on or below the diagonal only."""
    bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = pid_m * BM + tl.arange(0, BM)
    dd = tl.arange(0, DH)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=(rows < T)[:, None], other=0.0)
    base = SB + bh.to(tl.int64) * T * T
    for n0 in range(0, tl.minimum(pid_m * BM + BM, T), BN):
        cols = n0 + tl.arange(0, BN)
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dd[None, :], mask=(cols < T)[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        ok = (rows < T)[:, None] & (cols[None, :] <= rows[:, None])
        tl.store(base + rows[:, None] * T + cols[None, :], s.to(SB.dtype.element_ty), mask=ok)


@triton.jit
def _logits2(q, k, fb, T2H, rows, cols, T, qk_scale, PREC: tl.constexpr):
    """Logits in base 2 of a [rows, keys] tile (-inf outside the causal triangle): q k^T scale + F + t2."""
    ok = (rows < T)[:, None] & (cols[None, :] <= rows[:, None])
    f = tl.load(fb + rows[:, None] * T + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    t2 = tl.load(T2H + rows[:, None] - cols[None, :], mask=ok, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale + (f + t2) * 1.4426950408889634
    return tl.where(ok, s, float("-inf"))


@triton.jit
def _attn_fwd(Q, K, V, FB, T2, O, LSE, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
              T, qk_scale, H: tl.constexpr, DH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              PREC: tl.constexpr):
    """Online softmax over the logits of _logits2; lse in base 2."""
    bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = pid_m * BM + tl.arange(0, BM)
    dd = tl.arange(0, DH)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=(rows < T)[:, None], other=0.0)
    fb = FB + bh.to(tl.int64) * T * T
    t2h = T2 + h * (2 * T - 1) + T - 1
    m_i = tl.full([BM], -1e30, tl.float32)  # finite: padding rows see no key
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, DH], tl.float32)
    for n0 in range(0, tl.minimum(pid_m * BM + BM, T), BN):
        cols = n0 + tl.arange(0, BN)
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dd[None, :], mask=(cols < T)[:, None], other=0.0)
        v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + dd[None, :], mask=(cols < T)[:, None], other=0.0)
        s = _logits2(q, k, fb, t2h, rows, cols, T, qk_scale, PREC)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    l_i = tl.maximum(l_i, 1e-30)
    tl.store(O + b * sob + h * soh + rows[:, None] * sot + dd[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
             mask=(rows < T)[:, None])
    tl.store(LSE + bh * T + rows, m_i + tl.log2(l_i), mask=rows < T)


@triton.jit
def _attn_bwd(Q, K, V, FB, T2, DO, LSE, DELTA, GB, DV, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
              sdb, sdh, sdt, T, qk_scale, H: tl.constexpr, DH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              PREC: tl.constexpr):
    """Key owner: G = P (dO V^T - delta) into the G buffer (the gradient of the logits), and dV."""
    bh = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = bh // H
    h = bh % H
    cols = pid_n * BN + tl.arange(0, BN)
    dd = tl.arange(0, DH)
    k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dd[None, :], mask=(cols < T)[:, None], other=0.0)
    v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + dd[None, :], mask=(cols < T)[:, None], other=0.0)
    fb = FB + bh.to(tl.int64) * T * T
    gb = GB + bh.to(tl.int64) * T * T
    t2h = T2 + h * (2 * T - 1) + T - 1
    dv = tl.zeros([BN, DH], tl.float32)
    for m0 in range((pid_n * BN // BM) * BM, T, BM):
        rows = m0 + tl.arange(0, BM)
        rok = rows < T
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=rok[:, None], other=0.0)
        do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdt + dd[None, :], mask=rok[:, None], other=0.0)
        lse = tl.load(LSE + bh * T + rows, mask=rok, other=0.0)
        delta = tl.load(DELTA + bh * T + rows, mask=rok, other=0.0)
        s = _logits2(q, k, fb, t2h, rows, cols, T, qk_scale, PREC)  # [rows, keys]
        p = tl.exp2(s - lse[:, None])  # 0 outside the triangle (s = -inf there)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        g = p * (dp - delta[:, None])
        ok = rok[:, None] & (cols[None, :] <= rows[:, None])
        tl.store(gb + rows[:, None] * T + cols[None, :], g.to(GB.dtype.element_ty), mask=ok)
    tl.store(DV + b * svb + h * svh + cols[:, None] * svt + dd[None, :], dv.to(DV.dtype.element_ty),
             mask=(cols < T)[:, None])


@triton.jit
def _dq(DSB, K, DQ, skb, skh, skt, sqb, sqh, sqt, T, scale,
        H: tl.constexpr, DH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    """dQ = dS K / sqrt(d), one program per block of query rows."""
    bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = pid_m * BM + tl.arange(0, BM)
    dd = tl.arange(0, DH)
    base = DSB + bh.to(tl.int64) * T * T
    acc = tl.zeros([BM, DH], tl.float32)
    for n0 in range(0, tl.minimum(pid_m * BM + BM, T), BN):
        cols = n0 + tl.arange(0, BN)
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dd[None, :], mask=(cols < T)[:, None], other=0.0)
        ok = (rows < T)[:, None] & (cols[None, :] <= rows[:, None])
        ds = tl.load(base + rows[:, None] * T + cols[None, :], mask=ok, other=0.0)
        acc += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    tl.store(DQ + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], (acc * scale).to(DQ.dtype.element_ty),
             mask=(rows < T)[:, None])


@triton.jit
def _dk(DSB, Q, DK, sqb, sqh, sqt, skb, skh, skt, T, scale,
        H: tl.constexpr, DH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    """dK = dS^T Q / sqrt(d), one program per block of keys."""
    bh = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = bh // H
    h = bh % H
    cols = pid_n * BN + tl.arange(0, BN)
    dd = tl.arange(0, DH)
    base = DSB + bh.to(tl.int64) * T * T
    acc = tl.zeros([BN, DH], tl.float32)
    for m0 in range((pid_n * BN // BM) * BM, T, BM):
        rows = m0 + tl.arange(0, BM)
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=(rows < T)[:, None], other=0.0)
        ok = (rows < T)[:, None] & (cols[None, :] <= rows[:, None])
        ds = tl.load(base + rows[:, None] * T + cols[None, :], mask=ok, other=0.0)
        acc += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
    tl.store(DK + b * skb + h * skh + cols[:, None] * skt + dd[None, :], (acc * scale).to(DK.dtype.element_ty),
             mask=(cols < T)[:, None])


# --- host side ------------------------------------------------------------------------------------

# (BM, BN, num_warps, num_stages) per kernel; conv tiles are BM rows x BN distances. Conv tiles: the
# fastest of scripts/tune/time_skewed.py's sweep on an H100 at B 32, T 512 (notes/kernels.md).
CONFIG = {"scores": (64, 64, 4, 2), "attn_fwd": (64, 64, 4, 2), "attn_bwd": (64, 64, 4, 2),
          "dq": (64, 64, 4, 2), "dk": (64, 64, 4, 2), "conv_fwd": (8, 16, 8, 1), "conv_bwd": (8, 16, 8, 1)}
CONFIG_FP32 = {**CONFIG, "scores": (32, 32, 4, 1), "attn_fwd": (32, 32, 4, 1), "attn_bwd": (32, 32, 4, 1),
               "dq": (32, 32, 4, 1), "dk": (32, 32, 4, 1)}


def buffer_bytes(B: int, H: int, T: int, dtype=torch.bfloat16) -> int:
    """Bytes of one T x T buffer (S, F, G or dS): B H T^2 elements of the input dtype. The forward
    holds S and F; the backward S, F, G and dS at its peak."""
    return B * H * T * T * torch.finfo(dtype).bits // 8


class _Weights:
    """The conv weights in the kernels' layouts (zero padded to HP head slots, DP hidden channels,
    KP = pow2(k HP) tap-slot columns):
      w1c [KP, DP]       conv1 over concatenated taps: row t HP + s = W1[:, s, 0, t]
      w1t [KS, DP, HP]   conv1 tap t transposed (dX = dY W1_t^T)
      w2t [KS, DP, HP]   conv2 tap u (F += Z W2_u^T)
      w2c [KP, DP]       conv2 transposed over concatenated taps: row u HP + s = W2[s, :, 0, u]
      t1 [2T - 1, DP], k0 [h, T, DP] fp32."""

    def __init__(self, w1s, t1, k0, w2, cdt):
        D, H, _, KS = w1s.shape
        self.H, self.D, self.KS = H, D, KS
        self.HP, self.DP = pow2(H), pow2(D)
        self.KP = pow2(KS * self.HP)
        dev = w1s.device
        w1 = w1s.detach().float()[:, :, 0, :]  # [D, H, KS]
        w2f = w2.detach().float()[:, :, 0, :]  # [H, D, KS]
        w1c = torch.zeros(self.KP, self.DP, device=dev)
        w1c[:KS * self.HP].view(KS, self.HP, self.DP)[:, :H, :D] = w1.permute(2, 1, 0)
        w1t = torch.zeros(KS, self.DP, self.HP, device=dev)
        w1t[:, :D, :H] = w1.permute(2, 0, 1)
        w2t = torch.zeros(KS, self.DP, self.HP, device=dev)
        w2t[:, :D, :H] = w2f.permute(2, 1, 0)
        w2c = torch.zeros(self.KP, self.DP, device=dev)
        w2c[:KS * self.HP].view(KS, self.HP, self.DP)[:, :H, :D] = w2f.permute(2, 0, 1)
        self.w1c, self.w1t, self.w2t, self.w2c = (w.to(cdt).contiguous() for w in (w1c, w1t, w2t, w2c))
        T = k0.shape[-1]
        self.t1 = torch.zeros(2 * T - 1, self.DP, device=dev)
        self.t1[:, :D] = t1.detach().float().T
        self.k0 = torch.zeros(max(KS // 2, 1), T, self.DP, device=dev)
        self.k0[:KS // 2, :, :D] = k0.detach().float().permute(0, 2, 1)

    def meta(self):
        return dict(H=self.H, HP=self.HP, KS=self.KS, KP=self.KP, DP=self.DP)


def _tl_dtype(dtype):
    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]


def _scores_buffer(q, k, cfg):
    B, H, T, DH = q.shape
    sb = new((B, H, T, T), q)
    BM, BN, nw, ns = cfg["scores"]
    _scores[(B * H, triton.cdiv(T, BM))](q, k, sb, *strides(q), *strides(k), T, DH ** -0.5, H=H, DH=DH, BM=BM, BN=BN,
                                         PREC=dot_precision(q.dtype), num_warps=nw, num_stages=ns)
    return sb


def _conv_buffer(sb, wts, cfg):
    B, H, T, _ = sb.shape
    fb = new(sb.shape, sb)
    BM, BN, nw, ns = cfg["conv_fwd"]
    _conv_fwd[(triton.cdiv(T, BN), B)](sb, fb, wts.t1, wts.k0, wts.w1c, wts.w2t, T, BM=BM, BN=BN,
                                       CDT=_tl_dtype(wts.w1c.dtype), PREC=dot_precision(sb.dtype),
                                       num_warps=nw, num_stages=ns, **wts.meta())
    return fb


class DapeV2Skewed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, w1s, t1, k0, w2, t2, keep, cfg):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        B, H, T, DH = q.shape
        wts = _Weights(w1s, t1, k0, w2, q.dtype)
        t2f = t2.detach().float().contiguous()
        sb = _scores_buffer(q, k, cfg)
        fb = _conv_buffer(sb, wts, cfg)
        out = new_like(q)
        lse = new((B, H, T), q, torch.float32)
        BM, BN, nw, ns = cfg["attn_fwd"]
        _attn_fwd[(B * H, triton.cdiv(T, BM))](q, k, v, fb, t2f, out, lse, *strides(q), *strides(k), *strides(v),
                                               *strides(out), T, DH ** -0.5 * LOG2E, H=H, DH=DH, BM=BM, BN=BN,
                                               PREC=dot_precision(q.dtype), num_warps=nw, num_stages=ns)
        kept = (sb, fb) if keep else (None, None)
        ctx.save_for_backward(q, k, v, out, lse, t2f, *kept)
        ctx.wts, ctx.cfg, ctx.keep = wts, cfg, keep
        ctx.dtypes = (w1s.dtype, t1.dtype, k0.dtype, w2.dtype, t2.dtype)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, t2f, sb, fb = ctx.saved_tensors
        wts, cfg = ctx.wts, ctx.cfg
        B, H, T, DH = q.shape
        if not ctx.keep:
            sb = _scores_buffer(q, k, cfg)
            fb = _conv_buffer(sb, wts, cfg)
        dout = dout.contiguous()
        delta = (dout.float() * out.float()).sum(-1).contiguous()
        prec = dot_precision(q.dtype)
        scale = DH ** -0.5
        dq, dk, dv = new_like(q), new_like(k), new_like(v)
        gb = new(sb.shape, sb)
        BM, BN, nw, ns = cfg["attn_bwd"]
        _attn_bwd[(B * H, triton.cdiv(T, BN))](q, k, v, fb, t2f, dout, lse, delta, gb, dv, *strides(q), *strides(k),
                                               *strides(v), *strides(dout), T, scale * LOG2E, H=H, DH=DH, BM=BM,
                                               BN=BN, PREC=prec, num_warps=nw, num_stages=ns)
        del fb
        dsb = new(sb.shape, sb)
        BM, BN, nw, ns = cfg["conv_bwd"]
        n_band = triton.cdiv(T, BN)
        KSP = pow2(wts.KS, 1)
        dw1 = new((B * n_band, wts.KP, wts.DP), q, torch.float32)
        dw2 = new((B * n_band, wts.KP, wts.DP), q, torch.float32)
        dt1 = torch.zeros(B, 2 * T - 1, wts.DP, device=q.device)
        dk0 = torch.zeros(B, max(wts.KS // 2, 1), T, wts.DP, device=q.device)
        dt2 = new((B, T, wts.HP), q, torch.float32)
        _conv_bwd[(n_band, B)](sb, gb, dsb, wts.t1, wts.k0, wts.w1c, wts.w1t, wts.w2c, dw1, dw2, dt1, dk0,
                               dt2, T, KSP=KSP, BM=BM, BN=BN, CDT=_tl_dtype(wts.w1c.dtype), PREC=prec,
                               num_warps=nw, num_stages=ns, **wts.meta())
        del gb, sb
        BM, BN, nw, ns = cfg["dq"]
        _dq[(B * H, triton.cdiv(T, BM))](dsb, k, dq, *strides(k), *strides(q), T, scale, H=H, DH=DH, BM=BM, BN=BN,
                                         PREC=prec, num_warps=nw, num_stages=ns)
        BM, BN, nw, ns = cfg["dk"]
        _dk[(B * H, triton.cdiv(T, BN))](dsb, q, dk, *strides(q), *strides(k), T, scale, H=H, DH=DH, BM=BM, BN=BN,
                                         PREC=prec, num_warps=nw, num_stages=ns)
        # back from the kernel layouts to the op's inputs
        D, KS, HP = wts.D, wts.KS, wts.HP
        g1 = dw1.sum(0)[:KS * HP].view(KS, HP, -1)[:, :H, :D]  # [t, s, c]
        g_w1s = g1.permute(2, 1, 0).unsqueeze(2)
        g2 = dw2.sum(0)[:KS * HP].view(KS, HP, -1)[:, :H, :D]  # [u, s, c]
        g_w2 = g2.permute(1, 2, 0).unsqueeze(2)
        g_t1 = dt1.sum(0)[:, :D].T
        g_k0 = dk0.sum(0)[:KS // 2, :, :D].permute(0, 2, 1)
        g_t2 = torch.zeros(H, 2 * T - 1, device=q.device)
        g_t2[:, T - 1:] = dt2.sum(0)[:, :H].T
        dtypes = ctx.dtypes
        return (dq, dk, dv, g_w1s.to(dtypes[0]), g_t1.to(dtypes[1]), g_k0.to(dtypes[2]), g_w2.to(dtypes[3]),
                g_t2.to(dtypes[4]), None, None)


def dape_v2_skewed(q, k, v, w1, b1, w2, b2, table=None, keep: bool = True, config: dict | None = None):
    """softmax_causal(S + Bias + f(tril([S; Bias]))) V for q, k, v [B, H, T, d], as
    reference.dape_v2_reference (same arguments), through the T x T buffers of this module:
    differentiable in q, k, v, the conv weights and the table. keep: the forward keeps its S and
    F buffers for the backward (2 buffer_bytes) instead of recomputing them there. config: tile
    settings over CONFIG (tuning, tests)."""
    from .reference import dape_v2_tables

    check_qkv(q, k, v)
    B, H, T, d = q.shape
    D, C, _, ks = w1.shape
    if C != (2 * H if table is not None else H) or tuple(w2.shape) != (H, D, 1, ks):
        raise ValueError(f"conv weights {tuple(w1.shape)}, {tuple(w2.shape)} do not fit {H} heads "
                         f"{'with' if table is not None else 'without'} a bias table")
    if table is not None and tuple(table.shape) != (H, 2 * T - 1):
        raise ValueError(f"bias table must be [H, 2T - 1] = [{H}, {2 * T - 1}], got {tuple(table.shape)}")
    if table is not None:
        t1, k0, t2 = dape_v2_tables(w1, b1, b2, table, T)
    else:  # no bias channels: the tables are the conv biases at every distance
        t1, k0, t2 = b1[:, None].expand(D, 2 * T - 1), w1.new_zeros(ks // 2, D, T), b2[:, None].expand(H, 2 * T - 1)
    cfg = dict(CONFIG_FP32 if q.dtype == torch.float32 else CONFIG)
    unknown = set(config or {}) - set(cfg)
    if unknown:
        raise ValueError(f"unknown skewed-kernel settings {sorted(unknown)}; known: {sorted(cfg)}")
    cfg.update({key: tuple(val) for key, val in (config or {}).items()})
    return DapeV2Skewed.apply(q, k, v, w1[:, :H], t1, k0, w2, t2, keep, cfg)
