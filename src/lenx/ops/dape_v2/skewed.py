"""DAPE V2 for training: the score map through T x T buffers, the conv in (query, distance) tiles.

    out = softmax_causal(S + Bias + f(tril([S; Bias]))) V,   S = Q K^T / sqrt(d)

Rewrite A (reference.dape_v2_tables) turns the bias channels into per-distance tables, so the conv
sees only the H score channels: with m = i - j the distance,
    Y(i, m) = t1[m] - k0[key < h] + sum_t W1_t X(i, m + h - t),  X = tril(S) (0 outside 0 <= m <= i)
    Z = LeakyReLU(Y) (0 where the key i - m lies outside [0, T)),  F(i, m) = sum_u W2_u Z(i, m + h - u)
    logits = S + F + t2[m]                                          (h = k // 2)

Kernels, one job each (every product a plain tl.dot):
  _scores     S -> S buffer [B, H, P] (per head, causal tiles only), then _to_slots: the slot-minor
              S buffer [B, P, HP] the conv kernels read (a pair's HP = pow2(H) head slots one
              aligned run: their gathers are vector loads, and the pipeliner can stage them)
  _conv_z     S buffer -> hidden buffer Z = LeakyReLU(conv1(X)) [B, PZ, DP]: a program owns a band of
              BN distances (the first from -h: conv2 reads h keys right of the diagonal) and walks
              the query rows; a tile is BM rows x BN distances ("pairs"), all heads at once: conv1
              is one [pairs, head slots] @ [slots, hidden] dot per tap over the S buffer read at key
              offsets (a tap is an address offset, no register shifts)
  _conv_f     Z -> F buffer [B, H, P]: conv2 as one dot over its concatenated taps, each pair's taps one
              contiguous run of Z
  _attn_fwd   flash attention with logits Q K^T / sqrt(d) + F + t2 -> out, lse
  _attn_bwd   key owner: G = dL/dlogits -> G buffer [B, H, P], dV; then slot-minor as S
  _conv_dy    G and S buffers -> hidden buffer dY = LeakyReLU'(Y) conv2^T(G), and the gradients of W2
              and the tables: per-distance sums are column sums that the band's program keeps in
              registers while it walks the rows; no atomics, partials summed on the host
  _conv_dx    dY, G -> dS buffer [B, H, P]: G plus conv1^T(dY), one dot over concatenated taps; with S, the
              gradient of W1 from the same dY taps
  _dq, _dk    dQ = dS K, dK = dS^T Q from the dS buffer (query owner and key owner: deterministic)
Tiles are indexed (row, distance) but a tile's distances run in descending order, so its keys
ascend and every row of a tile is one contiguous run of each buffer. The buffers hold only the
causal triangle, packed row after row: row i of a score-shaped plane holds keys 0 .. i, padded to a
multiple of ALIGN entries (so that every row starts 16-byte aligned and the per-head kernels' row
runs stay vector loads and stores): P = _entries(T) ~ T (T + ALIGN) / 2 entries a plane. Row i of a
hidden plane holds keys 0 .. i + HALO (conv2 reads h <= HALO keys right of the diagonal; a pair's DP
channels are one aligned run anyway): PZ = T (T + 1 + 2 HALO) / 2. _row, _hrow and _planes, _hplanes
compute the offsets in int64. A load of a key past a row's end would read the next row, so every such
load is masked (the tests leave GAP poisoned entries after each row to check). The forward may keep
the S and F buffers for the backward (keep=True) or the backward recomputes them (memory).
"""

import functools

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from .._launch import LOG2E, check_dape_v2_weights, check_qkv, dot_precision, new, new_like, pow2, strides
from .reference import dape_v2_tables, residual_table

LN2 = 0.6931471805599453
# a score-shaped row's entries are a multiple of ALIGN = 2^ALIGN_BITS: 16 bytes of a 2-byte dtype
ALIGN_BITS = tl.constexpr(3)
ALIGN = tl.constexpr(1 << ALIGN_BITS.value)
# keys right of the diagonal a hidden buffer's row holds: k // 2 for the largest k the fused kernels
# take (7, triton.conv_unsupported_reason), so that buffer_bytes needs no kernel size
HALO = tl.constexpr(3)
# entries left unused after each row of every buffer: 0; the tests set it and poison those entries
# (a read past a row's last key then meets NaN instead of the next row)
GAP = tl.constexpr(0)


def _entries(T: int, hidden: bool = False) -> int:
    """Entries of one packed plane of T rows: _row(T) (score-shaped) or _hrow(T) (hidden)."""
    if hidden:
        return T * (T + 1 + 2 * HALO.value) // 2 + T * GAP.value
    a, m = ALIGN.value, T // ALIGN.value
    return a * (m + 1) * (T - a // 2 * m) + T * GAP.value


# --- packed triangles ------------------------------------------------------------------------------

@triton.jit
def _row(i):
    """Where row i of a score-shaped plane starts (int64, a multiple of ALIGN): row r holds
    ALIGN (r // ALIGN + 1) entries (keys 0 .. r, then padding), so with m = i // ALIGN the rows
    before i hold ALIGN (m + 1) (i - ALIGN m / 2) (and i GAP unused ones)."""
    i = i.to(tl.int64)
    m = i >> ALIGN_BITS  # i // ALIGN: a shift (a signed division costs registers in _conv_dx)
    off = ALIGN * (m + 1) * (i - ALIGN // 2 * m)
    if GAP > 0:
        off += i * GAP
    return off


@triton.jit
def _planes(n, T):
    """Where score-shaped plane n starts (int64; n a tensor): n planes of _row(T) entries."""
    return n.to(tl.int64) * _row(n * 0 + T)


@triton.jit
def _hrow(i):
    """Where row i of a hidden plane starts (int64): row r holds keys 0 .. r + HALO."""
    i = i.to(tl.int64)
    off = (i * (i + 1 + 2 * HALO)) >> 1
    if GAP > 0:
        off += i * GAP
    return off


@triton.jit
def _hplanes(n, T):
    """Where hidden plane n starts (int64; n a tensor): n planes of _hrow(T) entries."""
    return n.to(tl.int64) * _hrow(n * 0 + T)


# --- (query, distance) tiles -----------------------------------------------------------------------

@triton.jit
def _pairs(i0, n0, BM: tl.constexpr, BN: tl.constexpr):
    """Rows i, distances n and keys j of a tile's BM * BN pairs (row-major; distances descend)."""
    p = tl.arange(0, BM * BN)
    i = i0 + p // BN
    n = n0 + BN - 1 - p % BN
    return i, n, i - n


@triton.jit
def _slots(BUF, b, i, j, T, HP: tl.constexpr, TRANS: tl.constexpr = False):
    """[pairs, HP] tile (TRANS: [HP, pairs]) of a slot-minor buffer [B, P, HP] at (i, j), zero
    outside the causal triangle: a pair's head slots are one aligned run (vector loads; the padded
    slots hold zeros). TRANS loads the transposed tile from memory: a dot operand transposed in
    registers gave wrong weight gradients on the H100 (triton 3.6) at 128 columns or hidden 64."""
    s = tl.arange(0, HP)
    inside = (j >= 0) & (j <= i) & (i < T)
    pair = (_planes(b, T) + _row(i) + j) * HP
    if TRANS:
        x = tl.load(BUF + pair[None, :] + s[:, None], mask=inside[None, :], other=0.0)
    else:
        x = tl.load(BUF + pair[:, None] + s[None, :], mask=inside[:, None], other=0.0)
    return x


@triton.jit
def _band_table(T1, n0, T, BN: tl.constexpr, DP: tl.constexpr):
    """[BN, DP] rows of the table t1 for a band's distances n0 + BN - 1 - r (the order of a tile's
    distances), zero outside the table (|distance| < T): the same for every row of the band."""
    nn = n0 + BN - 1 - tl.arange(0, BN)
    inside = (nn >= 1 - T) & (nn <= T - 1)
    return tl.load(T1 + (nn + T - 1)[:, None] * DP + tl.arange(0, DP)[None, :], mask=inside[:, None], other=0.0)


@triton.jit
def _hidden(SB, b, t1b, K0, W1C, i0, n0, i, j, T, HP: tl.constexpr, KS: tl.constexpr, DP: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, CDT: tl.constexpr, PREC: tl.constexpr):
    """conv1 at the tile from row i0, distance n0 (pairs i, keys j): y [pairs, DP] (pre-activation)
    and where the key lies in [0, T) (conv2's zero padding elsewhere). t1b: the band's table rows."""
    HALF: tl.constexpr = KS // 2
    cc = tl.arange(0, DP)
    ss = tl.arange(0, HP)
    # one [pairs, head slots] gather and dot per tap: a third of the live tile of one dot over all
    # taps, and no padded tap columns
    y = tl.reshape(tl.broadcast_to(t1b[None, :, :], (BM, BN, DP)), (BM * BN, DP))
    for t in tl.static_range(KS):
        x = _slots(SB, b, i, j + t - HALF, T, HP)
        w1 = tl.load(W1C + (t * HP + ss)[:, None] * DP + cc[None, :])
        y += tl.dot(x.to(CDT), w1, input_precision=PREC)
    if HALF > 0:
        if i0 < n0 + BN - 1 + HALF:  # only tiles with keys j < h (a band's first rows)
            y -= _near_k0(K0, i, j, T, DP, HALF)
    keyok = (j >= 0) & (j < T) & (i < T)
    return y, keyok


@triton.jit
def _near_k0(K0, i, j, T, DP: tl.constexpr, HALF: tl.constexpr):
    """k0 at the pairs whose key j < h (they read conv1's zero padding where the table t1 assumed bias
    entries), 0 elsewhere: [pairs, DP]."""
    near = (j >= 0) & (j < HALF) & (i < T)
    return tl.load(K0 + (j * T + i)[:, None] * DP + tl.arange(0, DP)[None, :], mask=near[:, None], other=0.0)


@triton.jit
def _hidden_taps(HB, b, i, j, T, KS: tl.constexpr, DP: tl.constexpr, KZ: tl.constexpr):
    """[pairs, KZ] tile of a hidden buffer [B, PZ, DP]: column u DP + c holds channel c at (row i,
    key j - h + u), zero outside keys [0, T) and for padded columns u >= KS: for each pair one
    contiguous run of the buffer."""
    col = tl.arange(0, KZ)
    key = j[:, None] - KS // 2 + col[None, :] // DP
    ok = (col < KS * DP)[None, :] & (key >= 0) & (key < T) & (i < T)[:, None]
    base = HB + (_hplanes(b, T) + _hrow(i)) * DP  # keys <= i + h <= i + HALO: inside row i
    return tl.load(base[:, None] + key * DP + (col % DP)[None, :], mask=ok, other=0.0)


@triton.jit
def _edge_taps(T1, i, j, T, KS: tl.constexpr, DP: tl.constexpr, KZ: tl.constexpr):
    """[pairs, KZ] fp32, laid out as _hidden_taps: leaky(t1[i - key]) at the keys >= T that conv2 reads
    (the buffer reads 0 there, where residual_table counts z - leaky(t1) = -leaky(t1)); distances -h
    .. -1, so small: conv1's bias and the bias table at distance 0)."""
    HALF: tl.constexpr = KS // 2
    col = tl.arange(0, KZ)
    key = j[:, None] - HALF + col[None, :] // DP
    dist = i[:, None] - key
    out = (col < KS * DP)[None, :] & (i < T)[:, None] & (key >= T) & (dist > -T)
    t = tl.load(T1 + (dist + T - 1) * DP + (col % DP)[None, :], mask=out, other=0.0)
    return tl.where(t > 0, t, 0.01 * t)


@triton.jit
def _conv_z(SB, ZB, T1, K0, W1C, T, H: tl.constexpr, HP: tl.constexpr, KS: tl.constexpr,
            DP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CDT: tl.constexpr, PREC: tl.constexpr,
            RES: tl.constexpr):
    """Z = LeakyReLU(conv1(X)) into the hidden buffer (RES: the residual Z - P), for one band of BN
    distances walking its rows. Bands start at distance -h, so the first one also covers the keys
    right of the diagonal that conv2 reads (distances -h .. -1)."""
    HALF: tl.constexpr = KS // 2
    band = tl.num_programs(0) - 1 - tl.program_id(0)  # low distances (long walks) first
    b = tl.program_id(1)
    n0 = band * BN - HALF
    cc = tl.arange(0, DP)
    t1b = _band_table(T1, n0, T, BN, DP)
    for i0 in range((tl.maximum(n0, 0) // BM) * BM, T, BM):
        i, n, j = _pairs(i0, n0, BM, BN)
        y, keyok = _hidden(SB, b, t1b, K0, W1C, i0, n0, i, j, T, HP, KS, DP, BM, BN, CDT, PREC)
        z = tl.where(y > 0, y, 0.01 * y)
        if RES:
            # the residual Z - P, P = leaky(the table part of Y: t1, less k0 at keys j < h): bounded
            # by conv1 of the scores, where Z itself is in the hundreds with a large bias (ALiBi at
            # long T); the flash kernels add conv2(P) back (flash_tables)
            part = tl.reshape(tl.broadcast_to(t1b[None, :, :], (BM, BN, DP)), (BM * BN, DP))
            if HALF > 0:
                if i0 < n0 + BN - 1 + HALF:
                    part -= _near_k0(K0, i, j, T, DP, HALF)
            z -= tl.where(part > 0, part, 0.01 * part)
        ok = keyok & (n >= -HALF)
        ptr = ZB + ((_hplanes(b, T) + _hrow(i) + j) * DP)[:, None] + cc[None, :]
        tl.store(ptr, z.to(ZB.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _conv_f(ZB, FB, W2Z, T1, T, H: tl.constexpr, HP: tl.constexpr, KS: tl.constexpr, DP: tl.constexpr,
            KZ: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CDT: tl.constexpr, PREC: tl.constexpr,
            RES: tl.constexpr):
    """F = conv2 of the hidden buffer (one dot over conv2's concatenated taps per tile) into the F
    buffer. RES: F - g - e0 from the residual hidden buffer (in tiles whose taps reach keys >= T,
    less _edge_taps); g[i - j] and e0 (keys < 2h) are the flash kernels' (flash_tables)."""
    HALF: tl.constexpr = KS // 2
    band = tl.num_programs(0) - 1 - tl.program_id(0)
    b = tl.program_id(1)
    n0 = band * BN
    ss = tl.arange(0, HP)
    planes = _planes(b * H + ss, T)
    w2 = tl.load(W2Z + tl.arange(0, KZ)[:, None] * HP + ss[None, :])
    for i0 in range((n0 // BM) * BM, T, BM):
        i, n, j = _pairs(i0, n0, BM, BN)
        z = _hidden_taps(ZB, b, i, j, T, KS, DP, KZ)
        if RES:
            if i0 + BM - 1 - n0 + HALF >= T:  # some tap reads a key >= T
                z -= _edge_taps(T1, i, j, T, KS, DP, KZ).to(z.dtype)
        f = tl.dot(z.to(CDT), w2, input_precision=PREC)
        ok = (ss < H)[None, :] & ((n >= 0) & (n <= i) & (i < T))[:, None]
        tl.store(FB + planes[None, :] + (_row(i) + j)[:, None], f.to(FB.dtype.element_ty), mask=ok)


@triton.jit
def _conv_dy(SB, GB, DYB, T1, K0, W1C, W2C, DW2, DT1, DK0, DT2, T,
             H: tl.constexpr, HP: tl.constexpr, KS: tl.constexpr, KSP: tl.constexpr, DP: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, CDT: tl.constexpr, PREC: tl.constexpr):
    """Backward through conv2 and the activation for one band of distances (from -h, as _conv_z),
    walking its rows: dY = LeakyReLU'(Y) conv2^T(G) into the hidden buffer, and this program's
    share of dW2^T = G_taps^T Z and the table gradients (column sums: each (row, distance) belongs
    to one band). dW1 is _conv_dx's: it has dY's taps at every X pair."""
    HALF: tl.constexpr = KS // 2
    band = tl.num_programs(0) - 1 - tl.program_id(0)
    b = tl.program_id(1)
    prog = b * tl.num_programs(0) + band
    n0 = band * BN - HALF
    cc = tl.arange(0, DP)
    ss = tl.arange(0, HP)
    tt = tl.arange(0, KSP)
    dw2 = tl.zeros((KSP, HP, DP), tl.float32)  # [tap, head slot, channel]
    # the tables' gradients are column sums over the band's rows: summed in the tiles' own layouts
    # and reduced over rows once at the end (a reduction per tile cost shared-memory round trips and
    # barriers in every iteration)
    dt1 = tl.zeros((BM * BN, DP), tl.float32)
    dt2 = tl.zeros((BM * BN, HP), tl.float32)
    t1b = _band_table(T1, n0, T, BN, DP)
    for i0 in range((tl.maximum(n0, 0) // BM) * BM, T, BM):
        i, n, j = _pairs(i0, n0, BM, BN)
        y, keyok = _hidden(SB, b, t1b, K0, W1C, i0, n0, i, j, T, HP, KS, DP, BM, BN, CDT, PREC)
        keyok = keyok & (n >= -HALF)
        z = tl.where(keyok[:, None], tl.where(y > 0, y, 0.01 * y), 0.0)
        dz = tl.zeros((BM * BN, DP), tl.float32)
        for t in tl.static_range(KS):
            g = _slots(GB, b, i, j - t + HALF, T, HP)
            if t == HALF:
                dt2 += g.to(tl.float32)
            w2t = tl.load(W2C + (t * HP + ss)[:, None] * DP + cc[None, :])
            dz += tl.dot(g.to(CDT), w2t, input_precision=PREC)
        dy = tl.where(keyok[:, None], tl.where(y > 0, dz, 0.01 * dz), 0.0)
        tl.store(DYB + ((_hplanes(b, T) + _hrow(i) + j) * DP)[:, None] + cc[None, :],
                 dy.to(DYB.dtype.element_ty), mask=keyok[:, None])
        zc = z.to(CDT)
        for t in tl.static_range(KS):
            # transposed operand loaded from memory, not tl.trans of registers (wrong on the H100
            # at 128 tap x slot columns or hidden 64 with triton 3.6: notes/kernels.md has the case)
            gt = _slots(GB, b, i, j - t + HALF, T, HP, True)
            part = tl.dot(gt.to(CDT), zc, input_precision=PREC)
            dw2 += tl.where((tt == t)[:, None, None], part[None, :, :], 0.0)
        dt1 += dy
        if HALF > 0:
            if i0 < n0 + BN - 1 + HALF:
                near = keyok & (j < HALF)
                tl.store(DK0 + ((b * HALF + j) * T + i)[:, None] * DP + cc[None, :], -dy, mask=near[:, None])
    tl.store(DW2 + prog * KSP * HP * DP + ((tt[:, None] * HP + ss[None, :]) * DP)[:, :, None] + cc[None, None, :], dw2)
    nn = n0 + BN - 1 - tl.arange(0, BN)
    ok = (nn >= 1 - T) & (nn < T)  # the table holds |distance| < T
    dt1b = tl.sum(tl.reshape(dt1, (BM, BN, DP)), 0)
    dt2b = tl.sum(tl.reshape(dt2, (BM, BN, HP)), 0)
    tl.store(DT1 + (b * (2 * T - 1) + nn + T - 1)[:, None] * DP + cc[None, :], dt1b, mask=ok[:, None])
    tl.store(DT2 + (b * T + nn)[:, None] * HP + ss[None, :], dt2b, mask=((nn >= 0) & (nn < T))[:, None])


@triton.jit
def _conv_dx(GB, SB, DYB, DSB, W1X, DW1, T, H: tl.constexpr, HP: tl.constexpr, KS: tl.constexpr,
             DP: tl.constexpr, KZ: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CDT: tl.constexpr,
             PREC: tl.constexpr):
    """dS = G + conv1^T(dY) on the causal triangle: one dot over conv1's concatenated taps per tile.
    The same dY taps give this program's share of dW1: X at a pair times dY at the keys its taps
    feed, dW1[s, u DP + c] = sum X(i, j)[s] dY(i, j - h + u)[c] (tap k - 1 - u)."""
    band = tl.num_programs(0) - 1 - tl.program_id(0)
    b = tl.program_id(1)
    prog = b * tl.num_programs(0) + band
    n0 = band * BN
    ss = tl.arange(0, HP)
    planes = _planes(b * H + ss, T)
    zz = tl.arange(0, KZ)
    w1 = tl.load(W1X + zz[:, None] * HP + ss[None, :])
    dw1 = tl.zeros((HP, KZ), tl.float32)
    for i0 in range((n0 // BM) * BM, T, BM):
        i, n, j = _pairs(i0, n0, BM, BN)
        dyc = _hidden_taps(DYB, b, i, j, T, KS, DP, KZ).to(CDT)
        dx = tl.dot(dyc, w1, input_precision=PREC)
        causal = (n >= 0) & (n <= i) & (i < T)
        ds = _slots(GB, b, i, j, T, HP) + dx
        tl.store(DSB + planes[None, :] + (_row(i) + j)[:, None], ds.to(DSB.dtype.element_ty),
                 mask=(ss < H)[None, :] & causal[:, None])
        xt = _slots(SB, b, i, j, T, HP, True)  # zero off the triangle, where dyc need not be
        dw1 += tl.dot(xt.to(CDT), dyc, input_precision=PREC)
    tl.store(DW1 + prog * HP * KZ + ss[:, None] * KZ + zz[None, :], dw1)


# --- per-head flash kernels -----------------------------------------------------------------------

@triton.jit
def _score_tile(q, K, SB, b, h, rows, n0, skb, skh, skt, T, scale, DH: tl.constexpr, BN: tl.constexpr,
                MASK: tl.constexpr, PREC: tl.constexpr):
    cols = n0 + tl.arange(0, BN)
    dd = tl.arange(0, DH)
    if MASK:
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dd[None, :], mask=(cols < T)[:, None], other=0.0)
        ok = (rows < T)[:, None] & (cols[None, :] <= rows[:, None])
    else:  # a tile below the diagonal block: every key is before every row
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dd[None, :])
        ok = (rows < T)[:, None]
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
    tl.store(SB + _row(rows)[:, None] + cols[None, :], s.to(SB.dtype.element_ty), mask=ok)


@triton.jit
def _scores(Q, K, SB, sqb, sqh, sqt, skb, skh, skt, T, scale,
            H: tl.constexpr, DH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    """S = Q K^T / sqrt(d) into the S buffer, tiles on or below the diagonal only (BM a multiple of
    BN: key tiles before the diagonal block need no mask)."""
    bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    b = bh // H
    h = bh % H
    m0 = pid_m * BM
    rows = m0 + tl.arange(0, BM)
    dd = tl.arange(0, DH)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=(rows < T)[:, None], other=0.0)
    sb = SB + _planes(bh, T)
    for n0 in range(0, m0, BN):
        _score_tile(q, K, sb, b, h, rows, n0, skb, skh, skt, T, scale, DH, BN, False, PREC)
    for n0 in range(m0, tl.minimum(m0 + BM, T), BN):
        _score_tile(q, K, sb, b, h, rows, n0, skb, skh, skt, T, scale, DH, BN, True, PREC)


@triton.jit
def _logits2(q, k, fb, T2H, t2w, E0H, rows, cols, n0, T, qk_scale, NE: tl.constexpr, MASK: tl.constexpr,
             PREC: tl.constexpr):
    """Logits in base 2 of a [rows, keys] tile: q k^T scale + F + t2. MASK (tiles that cross the
    diagonal): -inf outside the causal triangle, t2 gathered from the head's table T2H by distance;
    else every key is before every row, rows past T read row T - 1 of F (finite values that are
    never used), and t2 is the tile's own run of the tile table (_t2_tiles; t2w its first element):
    a gather by distance is a 4-byte load per element, the tile table's rows are vector loads."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    if MASK:
        ok = (rows < T)[:, None] & (cols[None, :] <= rows[:, None])
        f = tl.load(fb + _row(rows)[:, None] + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        t2 = tl.load(T2H + rows[:, None] - cols[None, :], mask=ok, other=0.0)
        s = tl.where(ok, s + (f + t2) * 1.4426950408889634, float("-inf"))
    else:
        rows_c = tl.minimum(rows, T - 1)
        f = tl.load(fb + _row(rows_c)[:, None] + cols[None, :]).to(tl.float32)
        a = tl.arange(0, rows.shape[0])
        x = tl.arange(0, cols.shape[0])
        t2 = tl.load(t2w + a[:, None] * cols.shape[0] + x[None, :])
        s += (f + t2) * 1.4426950408889634
    if NE > 0:
        if n0 < NE:  # the first key tile: keys j < 2h take their edge term from E0 [T, NE] (fp32)
            e = tl.load(E0H + rows[:, None] * NE + cols[None, :], mask=(rows < T)[:, None] & (cols < NE)[None, :],
                        other=0.0)
            s += e * 1.4426950408889634
    return s


@triton.jit
def _fwd_tile(q, K, V, fb, t2h, t2w, e0h, b, h, rows, n0, m_i, l_i, acc, skb, skh, skt, svb, svh, svt, T, qk_scale,
              DH: tl.constexpr, BN: tl.constexpr, NE: tl.constexpr, MASK: tl.constexpr, PREC: tl.constexpr):
    cols = n0 + tl.arange(0, BN)
    dd = tl.arange(0, DH)
    kp = K + b * skb + h * skh + cols[:, None] * skt + dd[None, :]
    vp = V + b * svb + h * svh + cols[:, None] * svt + dd[None, :]
    if MASK:
        k = tl.load(kp, mask=(cols < T)[:, None], other=0.0)
        v = tl.load(vp, mask=(cols < T)[:, None], other=0.0)
    else:
        k = tl.load(kp)
        v = tl.load(vp)
    s = _logits2(q, k, fb, t2h, t2w, e0h, rows, cols, n0, T, qk_scale, NE, MASK, PREC)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _attn_fwd(Q, K, V, FB, T2, T2W, E0, O, LSE, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
              T, nq, qk_scale, H: tl.constexpr, DH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              NE: tl.constexpr, PREC: tl.constexpr):
    """Online softmax over the logits of _logits2; lse in base 2. BM a multiple of BN; T2W the tile
    table of t2 for BM x BN tiles (nq tiles per head)."""
    bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    b = bh // H
    h = bh % H
    m0 = pid_m * BM
    rows = m0 + tl.arange(0, BM)
    dd = tl.arange(0, DH)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=(rows < T)[:, None], other=0.0)
    fb = FB + _planes(bh, T)
    t2h = T2 + h * (2 * T - 1) + T - 1
    e0h = E0 + (h * T).to(tl.int64) * NE
    m_i = tl.full([BM], -1e30, tl.float32)  # finite: padding rows see no key
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, DH], tl.float32)
    t2w = T2W + (h * nq).to(tl.int64) * BM * BN
    for n0 in range(0, m0, BN):
        m_i, l_i, acc = _fwd_tile(q, K, V, fb, t2h, t2w + ((m0 - n0) // BN) * BM * BN, e0h, b, h, rows, n0, m_i,
                                  l_i, acc, skb, skh, skt, svb, svh, svt, T, qk_scale, DH, BN, NE, False, PREC)
    for n0 in range(m0, tl.minimum(m0 + BM, T), BN):
        m_i, l_i, acc = _fwd_tile(q, K, V, fb, t2h, t2w, e0h, b, h, rows, n0, m_i, l_i, acc, skb, skh, skt, svb,
                                  svh, svt, T, qk_scale, DH, BN, NE, True, PREC)
    l_i = tl.maximum(l_i, 1e-30)
    tl.store(O + b * sob + h * soh + rows[:, None] * sot + dd[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
             mask=(rows < T)[:, None])
    tl.store(LSE + bh * T + rows, m_i + tl.log2(l_i), mask=rows < T)


@triton.jit
def _bwd_tile(k, v, Q, DO, LSE, DELTA, fb, gb, t2h, t2w, e0h, b, h, bh, cols, n0, m0, dv, sqb, sqh, sqt, sdb, sdh,
              sdt, T, qk_scale, DH: tl.constexpr, BM: tl.constexpr, NE: tl.constexpr, MASK: tl.constexpr,
              PREC: tl.constexpr):
    rows = m0 + tl.arange(0, BM)
    rok = rows < T
    dd = tl.arange(0, DH)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=rok[:, None], other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdt + dd[None, :], mask=rok[:, None], other=0.0)
    lse = tl.load(LSE + bh * T + rows, mask=rok, other=float("inf"))  # padding rows: p = 0
    delta = tl.load(DELTA + bh * T + rows, mask=rok, other=0.0)
    s = _logits2(q, k, fb, t2h, t2w, e0h, rows, cols, n0, T, qk_scale, NE, MASK, PREC)  # [rows, keys]
    p = tl.exp2(s - lse[:, None])  # 0 outside the triangle (s = -inf there) and on padding rows
    dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)
    g = p * (dp - delta[:, None])
    ok = rok[:, None] & (cols[None, :] <= rows[:, None]) if MASK else rok[:, None]
    tl.store(gb + _row(rows)[:, None] + cols[None, :], g.to(gb.dtype.element_ty), mask=ok)
    return dv


@triton.jit
def _attn_bwd(Q, K, V, FB, T2, T2W, E0, DO, LSE, DELTA, GB, DV, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
              sdb, sdh, sdt, T, nq, qk_scale, H: tl.constexpr, DH: tl.constexpr, BM: tl.constexpr,
              BN: tl.constexpr, NE: tl.constexpr, PREC: tl.constexpr):
    """Key owner: G = P (dO V^T - delta) into the G buffer (the gradient of the logits), and dV. BN a
    multiple of BM: row blocks past the key block need no mask. T2W: the tile table of t2 for BM x BN
    tiles (nq tiles per head)."""
    bh = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = bh // H
    h = bh % H
    n0 = pid_n * BN
    cols = n0 + tl.arange(0, BN)
    dd = tl.arange(0, DH)
    k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dd[None, :], mask=(cols < T)[:, None], other=0.0)
    v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + dd[None, :], mask=(cols < T)[:, None], other=0.0)
    fb = FB + _planes(bh, T)
    gb = GB + _planes(bh, T)
    t2h = T2 + h * (2 * T - 1) + T - 1
    t2w = T2W + (h * nq).to(tl.int64) * BM * BN
    e0h = E0 + (h * T).to(tl.int64) * NE
    dv = tl.zeros([BN, DH], tl.float32)
    hi = tl.minimum(n0 + BN, T)
    for m0 in range(n0, hi, BM):
        dv = _bwd_tile(k, v, Q, DO, LSE, DELTA, fb, gb, t2h, t2w, e0h, b, h, bh, cols, n0, m0, dv, sqb, sqh, sqt,
                       sdb, sdh, sdt, T, qk_scale, DH, BM, NE, True, PREC)
    for m0 in range(hi, T, BM):
        dv = _bwd_tile(k, v, Q, DO, LSE, DELTA, fb, gb, t2h, t2w + ((m0 - n0) // BM) * BM * BN, e0h, b, h, bh, cols,
                       n0, m0, dv, sqb, sqh, sqt, sdb, sdh, sdt, T, qk_scale, DH, BM, NE, False, PREC)
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
    base = DSB + _planes(bh, T)
    acc = tl.zeros([BM, DH], tl.float32)
    for n0 in range(0, tl.minimum(pid_m * BM + BM, T), BN):
        cols = n0 + tl.arange(0, BN)
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dd[None, :], mask=(cols < T)[:, None], other=0.0)
        ok = (rows < T)[:, None] & (cols[None, :] <= rows[:, None])
        ds = tl.load(base + _row(rows)[:, None] + cols[None, :], mask=ok, other=0.0)
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
    base = DSB + _planes(bh, T)
    acc = tl.zeros([BN, DH], tl.float32)
    for m0 in range((pid_n * BN // BM) * BM, T, BM):
        rows = m0 + tl.arange(0, BM)
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=(rows < T)[:, None], other=0.0)
        ok = (rows < T)[:, None] & (cols[None, :] <= rows[:, None])
        ds = tl.load(base + _row(rows)[:, None] + cols[None, :], mask=ok, other=0.0)
        acc += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
    tl.store(DK + b * skb + h * skh + cols[:, None] * skt + dd[None, :], (acc * scale).to(DK.dtype.element_ty),
             mask=(cols < T)[:, None])


@triton.jit
def _delta(O, DO, DELTA, sob, soh, sot, sdb, sdh, sdt, T, H: tl.constexpr, DH: tl.constexpr, BR: tl.constexpr):
    """delta = rowsum(dO * O) in fp32 [B, H, T] from the strided O and dO: one launch for what were
    two fp32 casts, a product and a sum (and a copy of dO)."""
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    rows = tl.program_id(1) * BR + tl.arange(0, BR)
    dd = tl.arange(0, DH)
    ok = (rows < T)[:, None]
    o = tl.load(O + b * sob + h * soh + rows[:, None] * sot + dd[None, :], mask=ok, other=0.0).to(tl.float32)
    do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdt + dd[None, :], mask=ok, other=0.0).to(tl.float32)
    tl.store(DELTA + bh * T + rows, tl.sum(o * do, 1), mask=rows < T)


# --- layout change -------------------------------------------------------------------------------

@triton.jit
def _slots_block(SRC, DST, src_row, dst_row, i, s, j0, T, H: tl.constexpr, HP: tl.constexpr, BK: tl.constexpr,
                 DIAG: tl.constexpr):
    j = j0 + tl.arange(0, BK)
    if DIAG:  # keys past some rows: a mask along the keys (scalar loads)
        ok = (i < T)[:, None] & (j[None, :] <= i[:, None])
    else:  # every key before every row: the mask is constant along the keys (vector loads)
        ok = (i < T)[:, None] & (j >= 0)[None, :]
    x = tl.load(SRC + src_row[:, None, :] + j[None, :, None], mask=ok[:, :, None] & (s < H)[None, None, :], other=0.0)
    tl.store(DST + (dst_row[:, None] + j[None, :])[:, :, None] * HP + s[None, None, :], x, mask=ok[:, :, None])


@triton.jit
def _to_slots(SRC, DST, T, H: tl.constexpr, HP: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
    """The causal triangle of a head-planar buffer [B, H, P] (as the per-head kernels write it:
    whole vector stores per head) into a slot-minor one [B, P, HP] (as the conv kernels gather it:
    a pair's slots one aligned run), the padded slots zero; the transpose goes through shared memory."""
    pid = tl.program_id(0)
    b = tl.program_id(1)
    m0 = pid * BR
    i = m0 + tl.arange(0, BR)
    s = tl.arange(0, HP)
    src_row = _planes(b * H + s, T)[None, :] + _row(i)[:, None]  # [BR, HP]
    dst_row = _planes(b, T) + _row(i)  # [BR]
    full = (m0 // BK) * BK
    for j0 in range(0, full, BK):
        _slots_block(SRC, DST, src_row, dst_row, i, s, j0, T, H, HP, BK, False)
    for j0 in range(full, tl.minimum(m0 + BR, T), BK):
        _slots_block(SRC, DST, src_row, dst_row, i, s, j0, T, H, HP, BK, True)


# --- host side ------------------------------------------------------------------------------------

# (BM, BN, num_warps, num_stages) per kernel; conv tiles are BM rows x BN distances. attn_fwd 64 x 32: at
# 64 x 64 it spilled 1,072 bytes in an offline sm_90a compile (scripts/tune/compile_skewed.py), 64 x 32 none.
# The conv kernels at 3 stages: their row loops are latency-bound at one CTA per SM, and the pipeliner
# stages the slot-minor gathers (cp.async) a tile ahead (0.66 against 1.36 ms for _conv_dy at 1 stage,
# results/bench/h100_skewed_slots/). conv_f 16 rows, conv_dy 4 warps: the issue-28 tile sweep (-0.045, -0.06 ms at 512).
CONFIG = {"scores": (64, 64, 4, 2), "attn_fwd": (64, 32, 4, 2), "attn_bwd": (64, 64, 4, 2),
          "dq": (64, 64, 4, 2), "dk": (64, 64, 4, 2), "conv_z": (8, 16, 8, 3), "conv_f": (16, 16, 8, 3),
          "conv_dy": (8, 16, 4, 3), "conv_dx": (8, 16, 8, 3), "to_slots": (8, 64, 4, 1)}
# fp32 (the exactness tests): one stage, as the staged fp32 tiles would spill and fill shared memory
CONFIG_FP32 = {**CONFIG, "scores": (32, 32, 4, 1), "attn_fwd": (32, 32, 4, 1), "attn_bwd": (32, 32, 4, 1),
               "dq": (32, 32, 4, 1), "dk": (32, 32, 4, 1), "conv_z": (8, 16, 8, 1), "conv_f": (8, 16, 8, 1),
               "conv_dy": (8, 16, 8, 1), "conv_dx": (8, 16, 8, 1)}


def buffer_bytes(B: int, H: int, T: int, dtype=torch.bfloat16, channels: int | None = None) -> int:
    """Bytes of one packed T x T buffer, exactly as allocated here: B pow2(H) P elements of the input
    dtype for a score-shaped one (P = _entries(T) ~ T (T + ALIGN) / 2; the slot-minor S and G; F and
    dS hold H heads, so this bounds them too), B channels T (T + 1 + 2 HALO) / 2 for a hidden one (Z
    in the forward, dY in the backward; channels = the hidden width padded to a power of two). The
    forward holds S, Z and F at its peak, the backward S, G, dY and dS."""
    slots = pow2(H) if channels is None else channels
    return B * slots * _entries(T, channels is not None) * torch.finfo(dtype).bits // 8


class _Weights:
    """The conv weights in the kernels' layouts (zero padded to HP head slots, DP hidden channels;
    KP = pow2(k HP) tap x slot columns, KZ = pow2(k DP) tap x channel columns):
      w1c [KP, DP]   conv1 over its concatenated taps: row t HP + s = W1[:, s, 0, t]
      w2c [KP, DP]   conv2 transposed over its concatenated taps: row u HP + s = W2[s, :, 0, u]
      w2z [KZ, HP]   conv2 over concatenated hidden taps: row u DP + c = W2[:, c, 0, u]
      w1x [KZ, HP]   conv1 transposed over concatenated hidden taps: row u DP + c = W1[c, :, 0, k - 1 - u]
      t1 [2T - 1, DP], k0 [h, T, DP] fp32."""

    def __init__(self, w1s, t1, k0, w2, cdt):
        D, H, _, KS = w1s.shape
        self.H, self.D, self.KS = H, D, KS
        self.HP, self.DP = pow2(H), pow2(D)
        self.KP, self.KZ = pow2(KS * self.HP), pow2(KS * self.DP)
        dev = w1s.device
        w1 = w1s.detach().float()[:, :, 0, :]  # [D, H, KS]
        w2f = w2.detach().float()[:, :, 0, :]  # [H, D, KS]

        def packed(rows, block, cols, value):
            out = torch.zeros(rows, cols, device=dev)
            out[:KS * block].view(KS, block, cols)[:, :value.shape[1], :value.shape[2]] = value
            return out.to(cdt).contiguous()

        self.w1c = packed(self.KP, self.HP, self.DP, w1.permute(2, 1, 0))
        self.w2c = packed(self.KP, self.HP, self.DP, w2f.permute(2, 0, 1))
        self.w2z = packed(self.KZ, self.DP, self.HP, w2f.permute(2, 1, 0))
        self.w1x = packed(self.KZ, self.DP, self.HP, w1.permute(2, 0, 1).flip(0))
        self.T = T = k0.shape[-1]
        self.t1 = torch.zeros(2 * T - 1, self.DP, device=dev)
        self.t1[:, :D] = t1.detach().float().T
        self.k0 = torch.zeros(max(KS // 2, 1), T, self.DP, device=dev)
        self.k0[:KS // 2, :, :D] = k0.detach().float().permute(0, 2, 1)

    def meta(self):
        return dict(H=self.H, HP=self.HP, KS=self.KS, DP=self.DP)


_STAGES = {}  # (kernel, its settings) -> the stages that fit the device's shared memory


def _staged(kernel, grid, *args, num_stages, **settings):
    """Launch a conv kernel with the configured pipeline stages, fewer where the staged tiles do not
    fit in shared memory (large k or hidden widths: 284 KB at k 7, D 32, 3 stages); the count that
    fits is remembered per kernel and settings. Stages change the schedule, not the result."""
    key = (kernel.fn.__name__, tuple(sorted((name, str(val)) for name, val in settings.items())))
    stages = _STAGES.get(key, num_stages)
    while True:
        try:
            kernel[grid](*args, num_stages=stages, **settings)
        except OutOfResources:
            if stages == 1:
                raise
            stages -= 1
            continue
        _STAGES[key] = stages
        return


@functools.lru_cache(maxsize=8)
def _tile_distances(T: int, BM: int, BN: int, device: torch.device) -> torch.Tensor:
    """[nq, BM, BN] indices into a t2 row padded by BN on the left: tile q, row a, key x at distance
    q g + a - x (g = min(BM, BN), the step between tiles' row and key offsets), plus BN."""
    g = min(BM, BN)
    nq = triton.cdiv(T, g) + 1
    a = torch.arange(BM, device=device)[:, None]
    x = torch.arange(BN, device=device)[None, :]
    return (torch.arange(nq, device=device)[:, None, None] * g + a - x + BN).contiguous()


def _t2_tiles(t2f, T: int, BM: int, BN: int):
    """The tile table of t2 for the flash kernels' unmasked BM x BN tiles: [H, nq, BM, BN], tile q
    holding t2 at distance q g + a - x (row a, key x): a tile whose rows start q g after its keys
    reads one contiguous run. Distances past T - 1 (rows past T) and below 0 read zeros."""
    idx = _tile_distances(T, BM, BN, t2f.device)
    H, nq = t2f.shape[0], idx.shape[0]
    row = torch.zeros(H, (nq - 1) * min(BM, BN) + BM + BN, device=t2f.device)  # the largest index + 1
    row[:, BN:BN + T] = t2f[:, T - 1:]
    return row[:, idx], nq


# F's residual (RES in _conv_z, _conv_f; flash_tables) is kept only where storing Z and F themselves
# in the input's 2-byte type would cost more than RESIDUAL_TOL logit (the logits tests' bar).
# A 2-byte buffer rounds x to within u |x| (UNIT_ROUNDOFF). The table's share of the rounding: F's
# own, at most u max|g| (g: F's table part), plus Z's through conv2, a sum of k D independent
# roundings of at most u |z_c| each (channel c: |z_c| <= m_c = max_n |t1[c, n]| beyond conv1 of the
# scores, which both forms round alike): standard deviation <= u sqrt(sum_{c,t} w2[h,c,t]^2 m_c^2)
# / sqrt(3), the largest over the H T^2 entries about 6 of them, so SPREAD = 6 / sqrt(3) ~ 3.5.
# Examples (bf16, the model's DapeV2 and bias initialisations, H 12): Kerple-log 0.03-0.06 at T
# 512-16384 (no residual: the step-1 kernels), ALiBi 0.09 at T 64 and 2.3 at 1536, Kerple-power 10
# at 128 and 730 at 2048 (residual); a float64 model of the rounding points without the residual
# finds 0.013 at Kerple-log 512 and 0.6 at ALiBi 1536 (notes/kernels.md). fp32 never needs it.
RESIDUAL_TOL = 0.1
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
SPREAD = 3.5


def _error_estimate(t1, w2, u: float):
    """residual_error as a 0-dim fp32 tensor on t1's device (no sync)."""
    with torch.autocast(t1.device.type, enabled=False):
        t1f, w2f = t1.detach().float(), w2.detach().float()
        g = residual_table(t1f, w2f)
        m = t1f.abs().amax(1)  # [D]
        sd = (w2f[:, :, 0, :].pow(2).sum(-1) * m.pow(2)).sum(1).sqrt().max()
        return u * (g.abs().max() + SPREAD * sd)


def residual_error(t1, w2, dtype) -> float:
    """The estimate above of the logit error that 2-byte Z and F buffers of this dtype would add with
    these tables (0 for fp32). One host sync."""
    u = UNIT_ROUNDOFF.get(dtype)
    return 0.0 if u is None else _error_estimate(t1, w2, u).item()


class ResidualSwitch:
    """F's residual decided without a host sync after the first call, for a caller that runs the same
    weights again and again (a layer in training): each call starts residual_error's estimate on the
    device and copies it to pinned host memory; the next call at the same length and dtype reads it
    once that copy is done (an optimizer step later, the tables have barely moved) against
    RESIDUAL_TOL / MARGIN. decide() returns None (dape_v2_skewed then decides with a sync) on the
    first call, or while the copy is in flight."""

    MARGIN = 1.25

    def __init__(self):
        self._last = {}  # (length, dtype, device) -> (the estimate on the host, its copy's event or None)

    def __reduce__(self):  # a copy or pickle of the module that holds it starts afresh (events do not copy)
        return (ResidualSwitch, ())

    def decide(self, t1, w2, dtype) -> bool | None:
        u = UNIT_ROUNDOFF.get(dtype)
        if u is None:
            return False
        key = (t1.shape[1], dtype, t1.device)
        prev = self._last.get(key)
        est = _error_estimate(t1, w2, u)
        if t1.device.type == "cuda":
            host = torch.empty((), pin_memory=True)
            host.copy_(est, non_blocking=True)
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(t1.device))
            self._last[key] = (host, done)
        else:
            self._last[key] = (est, None)
        if prev is None or (prev[1] is not None and not prev[1].query()):
            return None
        return prev[0].item() > RESIDUAL_TOL / self.MARGIN


def flash_tables(t1, k0, w2, t2, residual: bool = True):
    """What the flash kernels add to S + F buffer (fp32): t2 + g [H, 2T - 1] (g = residual_table) and
    the edge term e0 [H, T, 2h] of keys j < 2h (an empty tensor for k = 1). The F buffer holds F - g
    - e0 (_conv_z, _conv_f), bounded by conv of the scores; F itself is in the hundreds with a large
    bias. e0[h, i, j] = sum_u W2_u (P - L)(i, j + u - h) over the keys < h that conv2 reads: L =
    leaky(t1[i - key]) is what g assumes at every key, P the table part of the hidden map (0 left of
    key 0, where conv2 reads zero padding; leaky(t1 - k0) at keys < h). residual=False: t2 and an
    empty e0 (the F buffer then holds F)."""
    if not residual:
        return t2.detach().float().contiguous(), t2.new_zeros(1, dtype=torch.float32)
    t1, k0, w2 = (x.detach().float() for x in (t1, k0, w2))
    t2f = (t2.detach().float() + residual_table(t1, w2)).contiguous()
    H, _, _, KS = w2.shape
    half, T = KS // 2, t1.shape[1] // 2 + 1
    if half == 0:
        return t2f, t2f.new_zeros(1)
    rows = torch.arange(T, device=t1.device)
    e0 = t1.new_zeros(2 * half, H, T)
    for j in range(2 * half):
        for u in range(KS):
            key = j + u - half
            if key >= half:
                continue
            dist = rows - key
            inside = dist < T  # t1 holds |distance| < T
            t = t1[:, (dist + T - 1).clamp(max=2 * T - 2)] * inside
            lt = torch.nn.functional.leaky_relu(t, 0.01)
            diff = -lt if key < 0 else torch.nn.functional.leaky_relu(t - k0[key], 0.01) - lt
            e0[j] += w2[:, :, 0, u] @ diff
    return t2f, e0.permute(1, 2, 0).contiguous()


def _tl_dtype(dtype):
    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]


def _scores_buffer(q, k, cfg):
    B, H, T, DH = q.shape
    sb = new((B, H, _entries(T)), q)
    BM, BN, nw, ns = cfg["scores"]
    _scores[(B * H, triton.cdiv(T, BM))](q, k, sb, *strides(q), *strides(k), T, DH ** -0.5, H=H, DH=DH, BM=BM, BN=BN,
                                         PREC=dot_precision(q.dtype), num_warps=nw, num_stages=ns)
    return _slots_buffer(sb, T, cfg)


def _slots_buffer(planar, T: int, cfg):
    """A head-planar buffer [B, H, P] as a slot-minor one [B, P, pow2(H)] (P: a packed plane of T rows)."""
    B, H, _ = planar.shape
    out = new((B, _entries(T), pow2(H)), planar)
    BR, BK, nw, ns = cfg["to_slots"]
    _to_slots[(triton.cdiv(T, BR), B)](planar, out, T, H=H, HP=pow2(H), BR=BR, BK=BK, num_warps=nw, num_stages=ns)
    return out


def _conv_buffer(sb, wts, cfg, residual: bool):
    """The F buffer: conv1 and the activation into a hidden buffer Z (freed here), then conv2; with
    the residual, their residual forms (flash_tables)."""
    B, T = sb.shape[0], wts.T
    cdt, prec = _tl_dtype(wts.w1c.dtype), dot_precision(sb.dtype)
    zb = new((B, _entries(T, hidden=True), wts.DP), sb)
    BM, BN, nw, ns = cfg["conv_z"]
    _staged(_conv_z, (triton.cdiv(T + wts.KS // 2, BN), B), sb, zb, wts.t1, wts.k0, wts.w1c, T, BM=BM, BN=BN,
            CDT=cdt, PREC=prec, RES=residual, num_warps=nw, num_stages=ns, **wts.meta())
    fb = new((B, wts.H, _entries(T)), sb)
    BM, BN, nw, ns = cfg["conv_f"]
    _staged(_conv_f, (triton.cdiv(T, BN), B), zb, fb, wts.w2z, wts.t1, T, KZ=wts.KZ, BM=BM, BN=BN,
            CDT=cdt, PREC=prec, RES=residual, num_warps=nw, num_stages=ns, **wts.meta())
    return fb


class DapeV2Skewed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, w1s, t1, k0, w2, t2, keep, cfg, residual):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        B, H, T, DH = q.shape
        wts = _Weights(w1s, t1, k0, w2, q.dtype)
        sb = _scores_buffer(q, k, cfg)
        if residual is None:
            # decided once the scores kernel is queued: the host sync then idles the GPU only between
            # that kernel and _conv_z's launch, not through the small host ops before it
            residual = residual_error(t1, w2, q.dtype) > RESIDUAL_TOL
        fb = _conv_buffer(sb, wts, cfg, residual)
        t2f, e0 = flash_tables(t1, k0, w2, t2, residual)
        out = new_like(q)
        lse = new((B, H, T), q, torch.float32)
        BM, BN, nw, ns = cfg["attn_fwd"]
        t2w, nq = _t2_tiles(t2f, T, BM, BN)
        _attn_fwd[(B * H, triton.cdiv(T, BM))](q, k, v, fb, t2f, t2w, e0, out, lse, *strides(q), *strides(k),
                                               *strides(v), *strides(out), T, nq, DH ** -0.5 * LOG2E, H=H, DH=DH,
                                               BM=BM, BN=BN, NE=e0.shape[-1] if e0.dim() == 3 else 0,
                                               PREC=dot_precision(q.dtype), num_warps=nw, num_stages=ns)
        del t2w
        kept = (sb, fb) if keep else (None, None)
        ctx.save_for_backward(q, k, v, out, lse, t2f, e0, *kept)
        ctx.wts, ctx.cfg, ctx.keep, ctx.residual = wts, cfg, keep, residual
        ctx.dtypes = (w1s.dtype, t1.dtype, k0.dtype, w2.dtype, t2.dtype)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, t2f, e0, sb, fb = ctx.saved_tensors
        wts, cfg = ctx.wts, ctx.cfg
        B, H, T, DH = q.shape
        if not ctx.keep:
            sb = _scores_buffer(q, k, cfg)
            fb = _conv_buffer(sb, wts, cfg, ctx.residual)
        if dout.stride(-1) != 1:  # the kernels take dO's other strides as they come
            dout = dout.contiguous()
        delta = new((B, H, T), q, torch.float32)
        _delta[(B * H, triton.cdiv(T, 64))](out, dout, delta, *strides(out), *strides(dout), T, H=H, DH=DH, BR=64)
        prec = dot_precision(q.dtype)
        scale = DH ** -0.5
        dq, dk, dv = new_like(q), new_like(k), new_like(v)
        gb = new((B, H, _entries(T)), q)
        BM, BN, nw, ns = cfg["attn_bwd"]
        t2w, nq = _t2_tiles(t2f, T, BM, BN)
        _attn_bwd[(B * H, triton.cdiv(T, BN))](q, k, v, fb, t2f, t2w, e0, dout, lse, delta, gb, dv, *strides(q),
                                               *strides(k), *strides(v), *strides(dout), T, nq, scale * LOG2E, H=H,
                                               DH=DH, BM=BM, BN=BN, NE=e0.shape[-1] if e0.dim() == 3 else 0, PREC=prec,
                                               num_warps=nw, num_stages=ns)
        del fb, t2w
        gb = _slots_buffer(gb, T, cfg)
        cdt = _tl_dtype(wts.w1c.dtype)
        dyb = new((B, _entries(T, hidden=True), wts.DP), sb)
        BM, BN, nw, ns = cfg["conv_dy"]
        n_band = triton.cdiv(T + wts.KS // 2, BN)
        KSP = pow2(wts.KS, 1)
        dw2 = new((B * n_band, KSP * wts.HP, wts.DP), q, torch.float32)
        dt1 = torch.zeros(B, 2 * T - 1, wts.DP, device=q.device)
        dk0 = torch.zeros(B, max(wts.KS // 2, 1), T, wts.DP, device=q.device)
        dt2 = new((B, T, wts.HP), q, torch.float32)
        _staged(_conv_dy, (n_band, B), sb, gb, dyb, wts.t1, wts.k0, wts.w1c, wts.w2c, dw2, dt1, dk0, dt2, T, KSP=KSP,
                BM=BM, BN=BN, CDT=cdt, PREC=prec, num_warps=nw, num_stages=ns, **wts.meta())
        dsb = new((B, H, _entries(T)), gb)
        BM, BN, nw, ns = cfg["conv_dx"]
        n_band = triton.cdiv(T, BN)
        dw1 = new((B * n_band, wts.HP, wts.KZ), q, torch.float32)
        _staged(_conv_dx, (n_band, B), gb, sb, dyb, dsb, wts.w1x, dw1, T, KZ=wts.KZ, BM=BM, BN=BN, CDT=cdt,
                PREC=prec, num_warps=nw, num_stages=ns, **wts.meta())
        del sb, gb, dyb
        BM, BN, nw, ns = cfg["dq"]
        _dq[(B * H, triton.cdiv(T, BM))](dsb, k, dq, *strides(k), *strides(q), T, scale, H=H, DH=DH, BM=BM, BN=BN,
                                         PREC=prec, num_warps=nw, num_stages=ns)
        BM, BN, nw, ns = cfg["dk"]
        _dk[(B * H, triton.cdiv(T, BN))](dsb, q, dk, *strides(q), *strides(k), T, scale, H=H, DH=DH, BM=BM, BN=BN,
                                         PREC=prec, num_warps=nw, num_stages=ns)
        # back from the kernel layouts to the op's inputs
        D, KS, HP = wts.D, wts.KS, wts.HP
        g1 = dw1.sum(0)[:H, :KS * wts.DP].view(H, KS, -1)[:, :, :D].permute(1, 0, 2).flip(0)  # [t, s, c]
        g_w1s = g1.permute(2, 1, 0).unsqueeze(2)
        g2 = dw2.sum(0)[:KS * HP].view(KS, HP, -1)[:, :H, :D]  # [u, s, c]
        g_w2 = g2.permute(1, 2, 0).unsqueeze(2)
        g_t1 = dt1.sum(0)[:, :D].T
        g_k0 = dk0.sum(0)[:KS // 2, :, :D].permute(0, 2, 1)
        g_t2 = torch.zeros(H, 2 * T - 1, device=q.device)
        g_t2[:, T - 1:] = dt2.sum(0)[:, :H].T
        dtypes = ctx.dtypes
        return (dq, dk, dv, g_w1s.to(dtypes[0]), g_t1.to(dtypes[1]), g_k0.to(dtypes[2]), g_w2.to(dtypes[3]),
                g_t2.to(dtypes[4]), None, None, None)


def host_tables(w1, b1, w2, b2, table, T: int):
    """Rewrite A's tables (t1 [D, 2T - 1], k0 [k // 2, D, T], t2 [H, 2T - 1]) for these weights and
    bias table (or none: then the tables are the conv biases at every distance); what
    dape_v2_skewed takes as `tables` (the triton backend caches them for forward-only work)."""
    D, ks, H = w1.shape[0], w1.shape[-1], w2.shape[0]
    if table is not None:
        # in the weights' dtype also under autocast: a bf16 einsum would cost t1 (hundreds with
        # ALiBi at long T) logit errors of ~1
        with torch.autocast(w1.device.type, enabled=False):
            return dape_v2_tables(w1, b1, b2, table, T)
    return b1[:, None].expand(D, 2 * T - 1), w1.new_zeros(ks // 2, D, T), b2[:, None].expand(H, 2 * T - 1)


def dape_v2_skewed(q, k, v, w1, b1, w2, b2, table=None, keep: bool = True, config: dict | None = None, tables=None,
                   residual: bool | None = None):
    """softmax_causal(S + Bias + f(tril([S; Bias]))) V for q, k, v [B, H, T, d], as
    reference.dape_v2_reference (same arguments), through the T x T buffers of this module:
    differentiable in q, k, v, the conv weights and the table. keep: the forward keeps its S and
    F buffers for the backward (2 buffer_bytes) instead of recomputing them there. config: tile
    settings over CONFIG (tuning, tests). tables: host_tables(w1, b1, w2, b2, table, T) if the caller
    has them (built here otherwise). residual: keep F's residual in the buffers (flash_tables); None
    decides from the tables (residual_error above RESIDUAL_TOL: a large bias in a 2-byte dtype)."""
    check_qkv(q, k, v)
    B, H, T, d = q.shape
    check_dape_v2_weights(w1, w2, H, T, table)
    if w1.shape[-1] // 2 > HALO.value:
        raise ValueError(f"the skewed kernels take conv kernel sizes <= {2 * HALO.value + 1}, got {w1.shape[-1]}")
    t1, k0, t2 = tables if tables is not None else host_tables(w1, b1, w2, b2, table, T)
    cfg = dict(CONFIG_FP32 if q.dtype == torch.float32 else CONFIG)
    unknown = set(config or {}) - set(cfg)
    if unknown:
        raise ValueError(f"unknown skewed-kernel settings {sorted(unknown)}; known: {sorted(cfg)}")
    cfg.update({key: tuple(val) for key, val in (config or {}).items()})
    for name in ("scores", "attn_fwd", "attn_bwd"):
        rows, keys = cfg[name][:2]
        if (rows % keys if name != "attn_bwd" else keys % rows) != 0:
            raise ValueError(f"{name} tiles {rows} x {keys}: the {'rows' if name != 'attn_bwd' else 'keys'} must be a "
                             f"multiple of the {'keys' if name != 'attn_bwd' else 'rows'} (unmasked off-diagonal tiles)")
    return DapeV2Skewed.apply(q, k, v, w1[:, :H], t1, k0, w2, t2, keep, cfg, residual)
