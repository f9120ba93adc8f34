"""Fused DAPE V2 causal attention, forward and backward, with no T x T tensor anywhere.

    out = softmax_causal(S + Bias + f(tril([S; Bias]))) V,   S = Q K^T / sqrt(d)
    f = conv2(leaky_relu(conv1(.), 0.01)), both convs (1, k) along keys with zero padding k // 2

The conv mixes all heads, so one program handles a block of BM query rows for ALL heads (padded to
HP, a power of two) and walks the keys in overlapping windows of BNW keys. A window's outputs are its
interior, positions [2h, BNW - 2h) with h = k // 2: each conv reads h keys either side, so the two
convs together need 2h keys of halo on each side, recomputed by the neighbouring windows.

Inside a window every (row, key) pair is one row of a [BM * BNW, channels] matrix, so each conv tap
is a tensor-core matmul: conv1 tap t is X [M, CP] @ W1_t [CP, DP] and conv2 tap t is
Z [M, DP] @ W2_t [DP, HP]; the shift of tap t along the keys is applied to the product with a
register gather (tl.gather along the key axis). Input channels are ordered (head, group) so the
score and bias tiles interleave with one tl.join: channel 2h is S_h, channel 2h + 1 is Bias_h.

Backward (like flash attention, it recomputes every tile from Q, K and the saved log-sum-exp):
  * a query-owner kernel: dQ, the conv weight and bias gradients (one partial per program, summed
    on the host) and the bias-table gradient (per-diagonal sums, then atomic adds);
  * a key-owner kernel: dK, dV. A window's gradient to its raw scores is complete only at keys
    whose every dependent output lies in the window, [4h, BNW - 4h), so windows step by BNW - 8h.
No locks anywhere.

Masks (HAS_W, HAS_SEG; off, the kernels compile as without them): a window of WIN keys and document
ids (DOCS, LASTS: each token's document's first and last position, _launch.check_masks). A hidden key
is one past the causal edge to the convolutions (conv1's input zero there); another document's key
does not exist (conv1's output zero there as well), as attention/masks.py says. The query-owner
kernels start their windows at the first key a row of the block sees (tiles.key_start) and the
key-owner kernel stops after the last row that sees its keys (_row_end): cost O(W), or O(the
documents' lengths), not O(T); ids mask inside the windows (tiles.window_document).
"""

import torch
import triton
import triton.language as tl

from .._launch import check_dape_v2_weights, check_masks, check_qkv, dot_precision, new, new_like, pow2, strides
from ..tiles import key_start, window_document


@triton.jit
def _shift(x, s, BM: tl.constexpr, BNW: tl.constexpr, C: tl.constexpr, CPREC: tl.constexpr):
    """y[:, w, :] = x[:, w + s, :] along the key axis (indices clamped at the window edges, where
    the values are never used). s may be a run-time value: the conv taps are a run-time loop so
    the compiler keeps one tap's tiles alive at a time (shared memory is the binding limit).
    With bf16 conv operands the gather moves bf16 (half the shared-memory scratch); every shifted
    tile is either a matmul operand that is rounded to bf16 anyway, or one tap's product."""
    if CPREC == "bf16":
        x = x.to(tl.bfloat16)
    idx = tl.arange(0, BNW)[None, :, None] + s
    idx = tl.minimum(tl.maximum(idx, 0), BNW - 1)
    return tl.gather(x, tl.broadcast_to(idx, (BM, BNW, C)), 1)


@triton.jit
def _cdot(a, b, CPREC: tl.constexpr):
    """A conv matmul: bf16 operands (fast) or fp32 operands at the given precision."""
    if CPREC == "bf16":
        out = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        out = tl.dot(a, b, input_precision=CPREC)
    return out


@triton.jit
def _window(q3, k3, TAB, W1, B1, W2, B2, rows, ws, T, scale, WIN, DOC, doc_r,
            H: tl.constexpr, HP: tl.constexpr, CP: tl.constexpr, DP: tl.constexpr, KS: tl.constexpr,
            HAS_BIAS: tl.constexpr, BM: tl.constexpr, BNW: tl.constexpr, PREC: tl.constexpr,
            CPREC: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    """Processed scores of rows x window keys ws .. ws + BNW - 1 for all heads.

    q3 [HP, BM, DH], k3 [HP, BNW, DH]. Returns X [M, CP] (conv1 input), y [BM, BNW, DP] (conv1
    output before the activation), zf [M, DP] (conv2 input), s [BM, BNW, HP] (processed scores,
    -inf outside the window's outputs and the mask), and the masks ex ([1 or BM, BNW]: the keys that
    exist for the row: in [0, T) and, with documents, of its document; elsewhere conv1's output is
    zero, as the padding past a sequence's ends), xm (tril, padding, window and documents: where the
    conv input is not zero; a key a mask hides reads as one past the diagonal) and valid (where s is
    an output). Masks: a window of WIN keys, documents as DOC (each token's document's first
    position) and doc_r (the rows' own), as in tiles.window_document."""
    HALF: tl.constexpr = KS // 2
    hh = tl.arange(0, HP)
    ww = tl.arange(0, BNW)
    cc = tl.arange(0, CP)
    ee = tl.arange(0, DP)
    keys = ws + ww
    kin = (keys >= 0) & (keys < T)
    xm = kin[None, :] & (keys[None, :] <= rows[:, None]) & (rows < T)[:, None]  # [BM, BNW]
    ex = kin[None, :]
    if HAS_W or HAS_SEG:  # keys clamped into [0, T): the others are out of xm and ex already
        kc = tl.minimum(tl.maximum(keys, 0), T - 1)[None, :]
        xm = window_document(xm, rows[:, None], kc, doc_r[:, None], DOC, T, WIN, HAS_W, HAS_SEG)
        if HAS_SEG:
            ex = window_document(ex, rows[:, None], kc, doc_r[:, None], DOC, T, WIN, False, HAS_SEG)
    S = tl.dot(q3, tl.permute(k3, (0, 2, 1)), input_precision=PREC) * scale  # [HP, BM, BNW]
    S = tl.where(xm[:, :, None], tl.permute(S, (1, 2, 0)), 0.0)  # [BM, BNW, HP], tril: 0 not -inf
    if HAS_BIAS:
        dist = rows[:, None] - keys[None, :] + T - 1
        bias = tl.load(TAB + hh[None, None, :] * (2 * T - 1) + dist[:, :, None],
                       mask=xm[:, :, None] & (hh < H)[None, None, :], other=0.0)
        X = tl.reshape(tl.join(S, bias), (BM * BNW, CP))
        base = S + bias
    else:
        X = tl.reshape(S, (BM * BNW, CP))
        base = S
    # conv1, tap t: y[w] += (X @ W1_t)[w + t - HALF]
    y = tl.zeros((BM, BNW, DP), tl.float32)
    for t in range(KS):
        w1 = tl.load(W1 + t * CP * DP + cc[:, None] * DP + ee[None, :])
        y += _shift(tl.reshape(_cdot(X, w1, CPREC), (BM, BNW, DP)), t - HALF, BM, BNW, DP, CPREC)
    y += tl.load(B1 + ee)[None, None, :]
    z = tl.where(y > 0, y, 0.01 * y)
    z = tl.where(ex[:, :, None], z, 0.0)  # conv2's zero padding outside [0, T) and the row's document
    zf = tl.reshape(z, (BM * BNW, DP))
    f = tl.zeros((BM, BNW, HP), tl.float32)
    for t in range(KS):
        w2 = tl.load(W2 + t * DP * HP + ee[:, None] * HP + hh[None, :])
        f += _shift(tl.reshape(_cdot(zf, w2, CPREC), (BM, BNW, HP)), t - HALF, BM, BNW, HP, CPREC)
    s = base + f + tl.load(B2 + hh)[None, None, :]
    inner = (ww >= 2 * HALF) & (ww < BNW - 2 * HALF)
    valid = xm & inner[None, :]
    s = tl.where(valid[:, :, None], s, float("-inf"))
    return X, y, zf, s, ex, xm, valid


@triton.jit
def _load_heads(P, b, sb, sh, st, rows, T, H: tl.constexpr, HP: tl.constexpr, DH: tl.constexpr):
    """[HP, len(rows), DH] tile of a [B, H, T, DH] tensor (zero for padded heads and rows)."""
    hh = tl.arange(0, HP)
    dd = tl.arange(0, DH)
    ptr = P + b * sb + hh[:, None, None] * sh + rows[None, :, None] * st + dd[None, None, :]
    mask = (hh < H)[:, None, None] & ((rows >= 0) & (rows < T))[None, :, None]
    return tl.load(ptr, mask=mask, other=0.0)


@triton.jit
def _load_rows(P, b, rows, T, H: tl.constexpr, HP: tl.constexpr):
    """[len(rows), HP] tile of a contiguous [B, H, T] fp32 tensor."""
    hh = tl.arange(0, HP)
    return tl.load(P + (b * H + hh[None, :]) * T + rows[:, None], mask=(rows < T)[:, None] & (hh < H)[None, :], other=0.0)


@triton.jit
def _first_key(m0, rows, T, WIN, DOC, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    """(the first key whose output a row of the block `rows` (m0 its first) may need, the rows'
    documents' first positions): 0 without masks; with a window or documents tiles.key_start's key
    (the windows over the keys start there: whole windows before it are skipped, the cost grows with
    W or the documents, not T). Padding rows take row T - 1's document."""
    first = 0
    doc_r = rows
    if HAS_W or HAS_SEG:
        first = key_start(m0, rows, T, WIN, DOC, 1, HAS_W, HAS_SEG)
    if HAS_SEG:
        doc_r = tl.load(DOC + tl.minimum(rows, T - 1))
    return first, doc_r


@triton.jit
def _dape_fwd(Q, K, V, TAB, W1, B1, W2, B2, O, LSE,
              sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
              T, scale, DOCS, WIN,
              H: tl.constexpr, HP: tl.constexpr, DH: tl.constexpr, CP: tl.constexpr, DP: tl.constexpr,
              KS: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BNW: tl.constexpr,
              PREC: tl.constexpr, CPREC: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    HALF: tl.constexpr = KS // 2
    STEP: tl.constexpr = BNW - 4 * HALF
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heavy (late) query blocks first: no long tail
    b = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    DOC = DOCS + b * T
    first, doc_r = _first_key(pid_m * BM, rows, T, WIN, DOC, HAS_W, HAS_SEG)
    q3 = _load_heads(Q, b, sqb, sqh, sqt, rows, T, H, HP, DH)
    m_i = tl.full([BM, HP], -1e30, tl.float32)  # finite: padding rows see no key at all
    l_i = tl.zeros([BM, HP], tl.float32)
    acc = tl.zeros([HP, BM, DH], tl.float32)
    last = tl.minimum(pid_m * BM + BM, T) - 1
    for ws in range(first - 2 * HALF, last - 2 * HALF + 1, STEP):
        keys = ws + tl.arange(0, BNW)
        k3 = _load_heads(K, b, skb, skh, skt, keys, T, H, HP, DH)
        X, y, zf, s, ex, xm, valid = _window(q3, k3, TAB, W1, B1, W2, B2, rows, ws, T, scale, WIN, DOC, doc_r,
                                             H, HP, CP, DP, KS, HAS_BIAS, BM, BNW, PREC, CPREC, HAS_W, HAS_SEG)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None, :])
        l_i = l_i * alpha + tl.sum(p, 1)
        v3 = _load_heads(V, b, svb, svh, svt, keys, T, H, HP, DH)
        pv = tl.dot(tl.permute(p, (2, 0, 1)).to(v3.dtype), v3, input_precision=PREC)  # [HP, BM, DH]
        acc = acc * tl.trans(alpha)[:, :, None] + pv
        m_i = m_new
    out = acc / tl.trans(tl.maximum(l_i, 1e-30))[:, :, None]
    hh = tl.arange(0, HP)
    dd = tl.arange(0, DH)
    optr = O + b * sob + hh[:, None, None] * soh + rows[None, :, None] * sot + dd[None, None, :]
    tl.store(optr, out.to(O.dtype.element_ty), mask=(hh < H)[:, None, None] & (rows < T)[None, :, None])
    lptr = LSE + (b * H + hh[None, :]) * T + rows[:, None]
    tl.store(lptr, m_i + tl.log(tl.maximum(l_i, 1e-30)), mask=(rows < T)[:, None] & (hh < H)[None, :])


@triton.jit
def _dp(do3, v3, PREC: tl.constexpr):
    """dP = dO V^T per head, [BM, BNW, HP]."""
    return tl.permute(tl.dot(do3, tl.permute(v3, (0, 2, 1)), input_precision=PREC), (1, 2, 0))


@triton.jit
def _window_grad(X, y, zf, s, ex, xm, dp, lse, delta, W1, W2, GW1, GW2,
                 HP: tl.constexpr, CP: tl.constexpr, DP: tl.constexpr, KS: tl.constexpr,
                 HAS_BIAS: tl.constexpr, BM: tl.constexpr, BNW: tl.constexpr, CPREC: tl.constexpr,
                 WANT_W: tl.constexpr):
    """Backward through one window, given dp = dO . v [BM, BNW, HP] (see _dp). Returns p
    [BM, BNW, HP], dS and dBias (gradients of the raw scores and bias entries, [BM, BNW, HP]) and
    the window's conv-bias gradients gb1 [DP], gb2 [HP]. When WANT_W, the conv weight gradients of
    the window are added into this program's own slots GW1 [KS, CP, DP], GW2 [KS, DP, HP] (atomic
    adds to addresses no other program touches: no contention, and no registers held across the
    window loop)."""
    HALF: tl.constexpr = KS // 2
    cc = tl.arange(0, CP)
    ee = tl.arange(0, DP)
    hh = tl.arange(0, HP)
    p = tl.exp(s - lse[:, None, :])  # 0 outside the outputs (s = -inf there)
    ds = p * (dp - delta[:, None, :])  # d loss / d s, zero outside the outputs
    # conv2: f[w] = sum_t V_t[w + t - HALF]  =>  dV_t[u] = ds[u - t + HALF]
    dz = tl.zeros((BM, BNW, DP), tl.float32)
    for t in range(KS):
        g = tl.reshape(_shift(ds, HALF - t, BM, BNW, HP, CPREC), (BM * BNW, HP))
        w2 = tl.load(W2 + t * DP * HP + ee[:, None] * HP + hh[None, :])
        dz += tl.reshape(_cdot(g, tl.trans(w2), CPREC), (BM, BNW, DP))
        if WANT_W:
            tl.atomic_add(GW2 + t * DP * HP + ee[:, None] * HP + hh[None, :], _cdot(tl.trans(zf), g, CPREC),
                          sem="relaxed")
    dy = tl.where(y > 0, dz, 0.01 * dz)
    dy = tl.where(ex[:, :, None], dy, 0.0)
    dX = tl.zeros((BM * BNW, CP), tl.float32)
    for t in range(KS):
        g = tl.reshape(_shift(dy, HALF - t, BM, BNW, DP, CPREC), (BM * BNW, DP))
        w1 = tl.load(W1 + t * CP * DP + cc[:, None] * DP + ee[None, :])
        dX += _cdot(g, tl.trans(w1), CPREC)
        if WANT_W:
            tl.atomic_add(GW1 + t * CP * DP + cc[:, None] * DP + ee[None, :], _cdot(tl.trans(X), g, CPREC),
                          sem="relaxed")
    if HAS_BIAS:
        dXs, dXb = tl.split(tl.reshape(dX, (BM, BNW, HP, 2)))
        dS = ds + tl.where(xm[:, :, None], dXs, 0.0)
        dB = ds + tl.where(xm[:, :, None], dXb, 0.0)
    else:
        dS = ds + tl.where(xm[:, :, None], tl.reshape(dX, (BM, BNW, HP)), 0.0)
        dB = dS
    gb1 = tl.sum(tl.sum(dy, 0), 0)
    gb2 = tl.sum(tl.sum(ds, 0), 0)
    return p, dS, dB, gb1, gb2


@triton.jit
def _dape_bwd_dq(Q, K, V, TAB, W1, B1, W2, B2, DO, LSE, DELTA, DQ, DTAB, GW1, GB1, GW2, GB2,
                 sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                 T, scale, DOCS, WIN,
                 H: tl.constexpr, HP: tl.constexpr, DH: tl.constexpr, CP: tl.constexpr, DP: tl.constexpr,
                 KS: tl.constexpr, HAS_BIAS: tl.constexpr, NEED_DTAB: tl.constexpr,
                 BM: tl.constexpr, BNW: tl.constexpr, E: tl.constexpr, PREC: tl.constexpr, CPREC: tl.constexpr,
                 HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    HALF: tl.constexpr = KS // 2
    STEP: tl.constexpr = BNW - 4 * HALF
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heavy (late) query blocks first: no long tail
    b = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    DOC = DOCS + b * T
    first, doc_r = _first_key(pid_m * BM, rows, T, WIN, DOC, HAS_W, HAS_SEG)
    q3 = _load_heads(Q, b, sqb, sqh, sqt, rows, T, H, HP, DH)
    do3 = _load_heads(DO, b, sdb, sdh, sdt, rows, T, H, HP, DH)
    lse = _load_rows(LSE, b, rows, T, H, HP)
    delta = _load_rows(DELTA, b, rows, T, H, HP)
    dq = tl.zeros([HP, BM, DH], tl.float32)
    slot = b * tl.num_programs(0) + pid_m
    GW1 = GW1 + slot * KS * CP * DP
    GW2 = GW2 + slot * KS * DP * HP
    gb1 = tl.zeros((DP,), tl.float32)
    gb2 = tl.zeros((HP,), tl.float32)
    hh = tl.arange(0, HP)
    ee = tl.arange(0, E)
    last = tl.minimum(pid_m * BM + BM, T) - 1
    for ws in range(first - 2 * HALF, last - 2 * HALF + 1, STEP):
        keys = ws + tl.arange(0, BNW)
        k3 = _load_heads(K, b, skb, skh, skt, keys, T, H, HP, DH)
        v3 = _load_heads(V, b, svb, svh, svt, keys, T, H, HP, DH)
        X, y, zf, s, ex, xm, valid = _window(q3, k3, TAB, W1, B1, W2, B2, rows, ws, T, scale, WIN, DOC, doc_r,
                                             H, HP, CP, DP, KS, HAS_BIAS, BM, BNW, PREC, CPREC, HAS_W, HAS_SEG)
        p, dS, dB, b1g, b2g = _window_grad(X, y, zf, s, ex, xm, _dp(do3, v3, PREC), lse, delta, W1, W2,
                                           GW1, GW2, HP, CP, DP, KS, HAS_BIAS, BM, BNW, CPREC, True)
        gb1 += b1g
        gb2 += b2g
        dq += tl.dot(tl.permute(dS, (2, 0, 1)).to(k3.dtype), k3, input_precision=PREC)
        if NEED_DTAB:
            # Sum dB over each diagonal i - j of the tile (gather lines the diagonals up along the
            # keys), then one atomic add per (distance, head).
            r = tl.arange(0, BM)[:, None, None]
            wi = r + (BNW - 1) - ee[None, :, None]
            ok = (wi >= 0) & (wi < BNW)
            g = tl.gather(dB, tl.broadcast_to(tl.where(ok, wi, 0), (BM, E, HP)), 1)  # [BM, E, HP]
            sums = tl.sum(tl.where(ok, g, 0.0), 0)  # [E, HP]
            dist = pid_m * BM - ws + ee - (BNW - 1)
            okd = (ee < BM + BNW - 1) & (dist >= 0) & (dist < T)
            tl.atomic_add(DTAB + hh[None, :] * (2 * T - 1) + (dist + T - 1)[:, None], sums,
                          mask=okd[:, None] & (hh < H)[None, :], sem="relaxed")
    dd = tl.arange(0, DH)
    qptr = DQ + b * sqb + hh[:, None, None] * sqh + rows[None, :, None] * sqt + dd[None, None, :]
    tl.store(qptr, (dq * scale).to(DQ.dtype.element_ty), mask=(hh < H)[:, None, None] & (rows < T)[None, :, None])
    # this program's share of the conv-bias gradients (summed over programs on the host)
    tl.store(GB1 + slot * DP + tl.arange(0, DP), gb1)
    tl.store(GB2 + slot * HP + hh, gb2)


@triton.jit
def _row_end(own0, keys, own, T, WIN, LAST, OWN: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    """One past the last row that sees one of the owned keys (own0 the first, `own` which of the
    window's keys): T; with a window at most own0 + OWN - 1 + WIN; with documents (LAST: each
    token's document's last position) one past the owned keys' latest document's last row
    (tiles.query_end, for a block of keys that is not a power of two)."""
    end = T
    if HAS_W:
        end = tl.minimum(end, own0 + OWN - 1 + WIN)
    if HAS_SEG:
        end = tl.minimum(end, tl.max(tl.load(LAST + keys, mask=own, other=0), 0) + 1)
    return end


@triton.jit
def _dape_bwd_dkdv(Q, K, V, TAB, W1, B1, W2, B2, DO, LSE, DELTA, DK, DV,
                   sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                   T, scale, DOCS, LASTS, WIN,
                   H: tl.constexpr, HP: tl.constexpr, DH: tl.constexpr, CP: tl.constexpr, DP: tl.constexpr,
                   KS: tl.constexpr, HAS_BIAS: tl.constexpr,
                   WANT_DK: tl.constexpr, WANT_DV: tl.constexpr, SPLIT: tl.constexpr,
                   BM: tl.constexpr, BNW: tl.constexpr, PREC: tl.constexpr, CPREC: tl.constexpr,
                   HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    """Key owner. With both WANT_DK and WANT_DV one pass; for large tiles (HP * BNW * d above
    DKDV_ONE_PASS_MAX) the launcher runs a dV pass (forward recompute only) and a dK pass, so fewer
    tiles are live at once (shared memory). Masks: a row reaches an owned key's gradient only where
    it sees the key (its score, and conv1's input there, are zero elsewhere), so the row blocks stop
    after the last row that does (_last_row): O(W) or O(the documents) blocks, not O(T)."""
    HALF: tl.constexpr = KS // 2
    OWN: tl.constexpr = BNW - 8 * HALF
    pid_n = tl.program_id(0)
    b = tl.program_id(1)
    own0 = pid_n * OWN
    ws = own0 - 4 * HALF
    keys = ws + tl.arange(0, BNW)
    ww = tl.arange(0, BNW)
    own = (ww >= 4 * HALF) & (ww < BNW - 4 * HALF) & (keys < T)
    DOC = DOCS + b * T
    end = _row_end(own0, keys, own, T, WIN, LASTS + b * T, OWN, HAS_W, HAS_SEG)
    if not SPLIT:
        k3 = _load_heads(K, b, skb, skh, skt, keys, T, H, HP, DH)
        v3 = _load_heads(V, b, svb, svh, svt, keys, T, H, HP, DH)
    dk = tl.zeros([HP, BNW, DH], tl.float32)
    dv = tl.zeros([HP, BNW, DH], tl.float32)
    # rows before own0 reach the owned keys only through entries the tril zeroes
    for m0 in range((own0 // BM) * BM, end, BM):
        rows = m0 + tl.arange(0, BM)
        doc_r = rows
        if HAS_SEG:
            doc_r = tl.load(DOC + tl.minimum(rows, T - 1))
        q3 = _load_heads(Q, b, sqb, sqh, sqt, rows, T, H, HP, DH)
        do3 = _load_heads(DO, b, sdb, sdh, sdt, rows, T, H, HP, DH)
        lse = _load_rows(LSE, b, rows, T, H, HP)
        if SPLIT:
            # Reloaded per row block (from L2) so each tile dies right after its one use and the
            # conv's temporaries can take its shared memory.
            k3 = _load_heads(K, b, skb, skh, skt, keys, T, H, HP, DH)
        if WANT_DK:
            delta = _load_rows(DELTA, b, rows, T, H, HP)
            if SPLIT:
                v3 = _load_heads(V, b, svb, svh, svt, keys, T, H, HP, DH)
            dp = _dp(do3, v3, PREC)  # before the conv, so V's tile is dead during it
        X, y, zf, s, ex, xm, valid = _window(q3, k3, TAB, W1, B1, W2, B2, rows, ws, T, scale, WIN, DOC, doc_r,
                                             H, HP, CP, DP, KS, HAS_BIAS, BM, BNW, PREC, CPREC, HAS_W, HAS_SEG)
        if WANT_DK:
            p, dS, dB, b1g, b2g = _window_grad(X, y, zf, s, ex, xm, dp, lse, delta, W1, W2, W1, W2,
                                               HP, CP, DP, KS, HAS_BIAS, BM, BNW, CPREC, False)
            dk += tl.dot(tl.permute(dS, (2, 1, 0)).to(q3.dtype), q3, input_precision=PREC)  # [HP, BNW, DH]
        if WANT_DV:
            p = tl.exp(s - lse[:, None, :])
            dv += tl.dot(tl.permute(p, (2, 1, 0)).to(do3.dtype), do3, input_precision=PREC)
    hh = tl.arange(0, HP)
    dd = tl.arange(0, DH)
    mask = (hh < H)[:, None, None] & own[None, :, None]
    if WANT_DK:
        tl.store(DK + b * skb + hh[:, None, None] * skh + keys[None, :, None] * skt + dd[None, None, :],
                 (dk * scale).to(DK.dtype.element_ty), mask=mask)
    if WANT_DV:
        tl.store(DV + b * svb + hh[:, None, None] * svh + keys[None, :, None] * svt + dd[None, None, :],
                 dv.to(DV.dtype.element_ty), mask=mask)


# Tile shapes (BM query rows, BNW window keys, num_warps, num_stages). BM >= 16 for tl.dot. A
# window yields BNW - 4h outputs (forward, dQ) and BNW - 8h owned keys (dK/dV), h = k // 2, so
# k = 5, 7 need 32-key windows. k <= 3 takes 32 keys too where that fits in the 227 KB of shared
# memory (bf16 conv operands, hidden <= 32), else 16. Larger tiles overflow the SM's registers and
# shared memory; one pipeline stage for the same reason. Measured: scripts/tune/tile_sweep.py and
# the offline sm_90 compiles in notes/kernels.md.
DKDV_ONE_PASS_MAX = 16 * 16 * 64  # HP * BNW * DH up to which dK and dV share one pass
TILES = {
    "k3": (16, 32, 8, 1),  # k <= 3, hidden <= 32, bf16 conv operands (the common case)
    "k3_big": (16, 16, 8, 1),  # k <= 3 with hidden 64, tf32 or fp32 conv operands
    "k57": (16, 32, 8, 1),  # k = 5, 7 (hidden <= 32)
}


def tile_config(kernel_size: int, hidden_padded: int, conv_precision: str, overrides: dict | None = None) -> dict:
    """The launch settings of one call: "tiles" (BM, BNW, num_warps, num_stages) for its kernel size,
    hidden width and conv precision, and "split_dkdv" (None: split the key-owner pass in two when
    its tiles exceed DKDV_ONE_PASS_MAX; True/False: force it), with `overrides` on top."""
    if kernel_size > 3:
        tiles = TILES["k57"]
    else:
        tiles = TILES["k3" if hidden_padded <= 32 and conv_precision == "bf16" else "k3_big"]
    cfg = {"tiles": tiles, "split_dkdv": None}
    unknown = set(overrides or {}) - set(cfg)
    if unknown:
        raise ValueError(f"unknown DAPE V2 launch settings {sorted(unknown)}; known: {sorted(cfg)}")
    cfg.update(overrides or {})
    cfg["tiles"] = tuple(cfg["tiles"])
    return cfg


def _shapes(H, D, kernel_size, has_bias):
    HP = pow2(H)
    return dict(H=H, HP=HP, CP=2 * HP if has_bias else HP, DP=pow2(D), KS=kernel_size)


def _pack_weights(w1, b1, w2, b2, H, D, ks, has_bias, HP, CP, DP):
    """conv weights -> kernel layouts: W1 [KS, CP, DP], W2 [KS, DP, HP], b1 [DP], b2 [HP] (fp32,
    zero padded). Module channel g * H + h (g = 0 scores, 1 bias) goes to kernel channel 2h + g."""
    dev = w1.device
    chan = _channel_map(H, has_bias, dev)
    W1 = torch.zeros(ks, CP, DP, device=dev)
    W1[:, chan, :D] = w1[:, :, 0, :].detach().float().permute(2, 1, 0)
    W2 = torch.zeros(ks, DP, HP, device=dev)
    W2[:, :D, :H] = w2[:, :, 0, :].detach().float().permute(2, 1, 0)
    B1 = torch.zeros(DP, device=dev)
    B1[:D] = b1.detach().float()
    B2 = torch.zeros(HP, device=dev)
    B2[:H] = b2.detach().float()
    return W1.contiguous(), B1, W2.contiguous(), B2


def _channel_map(H, has_bias, device):
    h = torch.arange(H, device=device)
    return torch.cat([2 * h, 2 * h + 1]) if has_bias else h


class DapeV2Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, w1, b1, w2, b2, conv_precision, overrides, window=0, spans=None):
        """window, spans: as _launch.check_masks returns them."""
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        B, H, T, DH = q.shape
        D, ks = w1.shape[0], w1.shape[-1]
        has_bias = table is not None
        sh = _shapes(H, D, ks, has_bias)
        W1, B1, W2, B2 = _pack_weights(w1, b1, w2, b2, H, D, ks, has_bias, sh["HP"], sh["CP"], sh["DP"])
        tab = table.detach().float().contiguous() if has_bias else W1  # dummy pointer when unused
        prec = dot_precision(q.dtype)
        cprec = "ieee" if q.dtype == torch.float32 else conv_precision
        cfg = tile_config(ks, sh["DP"], cprec, overrides)
        out = new_like(q)
        lse = new((B, H, T), q, torch.float32)
        BM, BNW, nw, ns = cfg["tiles"]
        docs = spans if spans is not None else lse  # pointers the kernels never read without documents
        masks = dict(HAS_W=window > 0, HAS_SEG=spans is not None)
        _dape_fwd[(triton.cdiv(T, BM), B)](
            q, k, v, tab, W1, B1, W2, B2, out, lse, *strides(q), *strides(k), *strides(v), *strides(out), T, DH ** -0.5,
            docs[0], window, DH=DH, HAS_BIAS=has_bias, BM=BM, BNW=BNW, PREC=prec, CPREC=cprec, **masks,
            num_warps=nw, num_stages=ns, **sh)
        ctx.save_for_backward(q, k, v, tab, W1, B1, W2, B2, out, lse, docs)
        ctx.window, ctx.masks = window, masks
        ctx.meta = (has_bias, D, ks, cprec, w1.dtype, b1.dtype, w2.dtype, b2.dtype)
        ctx.cfg = cfg
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, tab, W1, B1, W2, B2, out, lse, docs = ctx.saved_tensors
        has_bias, D, ks, cprec, *wdt = ctx.meta
        B, H, T, DH = q.shape
        sh = _shapes(H, D, ks, has_bias)
        HP, CP, DP = sh["HP"], sh["CP"], sh["DP"]
        dout = dout.contiguous()
        delta = (dout.float() * out.float()).sum(-1).contiguous()  # [B, H, T]
        prec = dot_precision(q.dtype)
        dq, dk, dv = new_like(q), new_like(k), new_like(v)
        need_dtab = has_bias and ctx.needs_input_grad[3]
        dtab = torch.zeros(H, 2 * T - 1, device=q.device) if need_dtab else W1
        scale = DH ** -0.5
        common = (*strides(q), *strides(k), *strides(v), *strides(dout), T, scale)
        masks = ctx.masks

        BM, BNW, nw, ns = ctx.cfg["tiles"]
        n_m = triton.cdiv(T, BM)
        # per-program slots for the conv weight gradients, filled by atomic adds: start at zero
        gw1 = torch.zeros((B * n_m, ks, CP, DP), device=q.device)
        gw2 = torch.zeros((B * n_m, ks, DP, HP), device=q.device)
        gb1 = new((B * n_m, DP), q, torch.float32)
        gb2 = new((B * n_m, HP), q, torch.float32)
        _dape_bwd_dq[(n_m, B)](
            q, k, v, tab, W1, B1, W2, B2, dout, lse, delta, dq, dtab, gw1, gb1, gw2, gb2, *common, docs[0], ctx.window,
            DH=DH, HAS_BIAS=has_bias, NEED_DTAB=need_dtab, BM=BM, BNW=BNW,
            E=triton.next_power_of_2(BM + BNW - 1), PREC=prec, CPREC=cprec, **masks, num_warps=nw, num_stages=ns, **sh)

        own = BNW - 8 * (ks // 2)
        # one key-owner pass where its tiles fit in shared memory, else a dV pass and a dK pass
        split = ctx.cfg["split_dkdv"]
        if split is None:
            split = HP * BNW * DH > DKDV_ONE_PASS_MAX
        passes = [(False, True), (True, False)] if split else [(True, True)]
        for want_dk, want_dv in passes:
            _dape_bwd_dkdv[(triton.cdiv(T, own), B)](
                q, k, v, tab, W1, B1, W2, B2, dout, lse, delta, dk, dv, *common, docs[0], docs[-1], ctx.window,
                DH=DH, HAS_BIAS=has_bias, WANT_DK=want_dk, WANT_DV=want_dv,
                SPLIT=len(passes) > 1, BM=BM, BNW=BNW,
                PREC=prec, CPREC=cprec, **masks, num_warps=nw, num_stages=ns, **sh)

        # back from the kernel layouts to the module's conv parameters
        chan = _channel_map(H, has_bias, q.device)
        dw1 = gw1.sum(0)[:, chan, :D].permute(2, 1, 0).unsqueeze(2).to(wdt[0])
        db1 = gb1.sum(0)[:D].to(wdt[1])
        dw2 = gw2.sum(0)[:, :D, :H].permute(2, 1, 0).unsqueeze(2).to(wdt[2])
        db2 = gb2.sum(0)[:H].to(wdt[3])
        return dq, dk, dv, (dtab if need_dtab else None), dw1, db1, dw2, db2, None, None, None, None


def conv_unsupported_reason(H, hidden, kernel_size):
    """Why no fused DAPE V2 kernel (this one or the skewed ones) takes these conv sizes, or None."""
    if H > 32 or hidden > 64 or kernel_size > 7:
        return "the fused DAPE V2 kernel takes H <= 32, hidden <= 64, kernel_size <= 7"
    if kernel_size >= 5 and hidden > 32:
        return "the fused DAPE V2 kernel takes hidden <= 32 when kernel_size >= 5"
    return None


def shape_unsupported_reason(H, d, hidden, kernel_size, conv_precision="bf16", dtype=None):
    """Why the fused kernel cannot take this shape (and input dtype), or None. The limits are the
    H100/H200 shared memory (227 KB per program) with one program holding a window for all heads:
    measured by compiling for sm_90 offline (scripts/tune/offline_compile.py, notes/kernels.md)."""
    HP = pow2(H)
    reason = conv_unsupported_reason(H, hidden, kernel_size)
    if reason:
        return reason
    if HP * d > 1024:
        return f"the fused DAPE V2 kernel takes (heads padded to {HP}) x head dim <= 1024, got {HP} x {d}"
    if dtype == torch.float32 and (kernel_size > 3 or d > 32):
        # fp32 tiles are twice bf16's: the backward's 32-key windows (k 5, 7) or a head dim of 64
        # need 229-336 KB (offline sm_90a compiles); every k <= 3, d <= 32 shape compiled fits
        return (f"fp32 inputs fit the fused DAPE V2 kernel only at kernel_size <= 3 and head dim <= 32, "
                f"got {kernel_size} and {d} (bf16 inputs take both)")
    if conv_precision == "tf32" and (kernel_size > 3 or hidden > 32):
        return "tf32 conv matmuls fit only kernel_size <= 3 and hidden <= 32 (use conv_precision='bf16')"
    return None


def dape_v2_triton(q, k, v, w1, b1, w2, b2, table=None, conv_precision: str = "bf16", config: dict | None = None,
                   window: int = 0, segments=None):
    """softmax_causal(S + Bias + f(tril([S; Bias]))) V for q, k, v [B, H, T, d], as
    reference.dape_v2_reference: the conv weights w1 [D, C, 1, k], b1 [D], w2 [H, D, 1, k], b2 [H]
    (C = 2H with a bias table, H without); table None or the bias table [H, 2T - 1]. Differentiable
    in q, k, v, the table and the conv weights. conv_precision: "bf16" (default) or "tf32", the
    operands of the conv matmuls (fp32 inputs always use exact fp32 products). config: launch
    settings over the defaults (see tile_config), for tuning and tests.

    window: each row sees its `window` most recent keys (0: all); segments: document ids [B, T] (any
    integers), no row sees another document's key. A key a mask hides reads, to the convolutions, as
    one past the causal edge (zero input); another document's key does not exist (conv1's output
    there is zero too), so each document's rows are those of it run alone (attention/masks.py)."""
    check_qkv(q, k, v)
    B, H, T, d = q.shape
    D, _, _, ks = w1.shape
    check_dape_v2_weights(w1, w2, H, T, table)
    # shared memory binds on the GPU only (Triton's interpreter runs any tile)
    reason = shape_unsupported_reason(H, d, D, ks, conv_precision, q.dtype if q.is_cuda else None)
    if reason:
        raise ValueError(reason + "; use backend='chunked'")
    if conv_precision not in ("tf32", "bf16"):
        raise ValueError(f"conv_precision must be 'tf32' or 'bf16', got {conv_precision!r}")
    window, spans = check_masks(window, segments, B, T, q.device)
    return DapeV2Attention.apply(q, k, v, table, w1, b1, w2, b2, conv_precision, config, window, spans)
