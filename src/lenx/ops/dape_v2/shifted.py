"""DAPE V2 forward with the conv's key shifts taken by the score products (experiment).

The windowed kernel (triton.py) computes a window's scores once and shifts conv outputs along the
keys with register gathers. Here nothing is shifted: the conv input at key j + u is the score of
key j + u, so it is recomputed from a K tile loaded u keys further on. conv2 tap s needs conv1's
output at j + s - h, and that needs the inputs at j + s + t - 2h for each conv1 tap t: k * k score
products per key block instead of one, in exchange for no gathers, no halo (key blocks do not
overlap) and a channels-first layout ([channels, rows * keys]) in which the score products'
outputs feed the conv matmuls as they are.
"""

import triton
import triton.language as tl

from .triton import _cdot, _load_heads


@triton.jit
def _inputs(q3, K, TAB, b, skb, skh, skt, rows, keys, T,
            H: tl.constexpr, HP: tl.constexpr, DH: tl.constexpr, HAS_BIAS: tl.constexpr, PREC: tl.constexpr,
            MASK: tl.constexpr):
    """Unscaled scores (q . k) and bias of rows x keys for all heads, [HP, BM, BN] each, zero where
    the conv input is zero (key above the row, outside [0, T), or a padding row). MASK False: a
    block with none of those (no masks, no bounds)."""
    hh = tl.arange(0, HP)
    if MASK:
        xm = (keys[None, :] <= rows[:, None]) & ((keys >= 0) & (keys < T))[None, :] & (rows < T)[:, None]
    k3 = _load_heads(K, b, skb, skh, skt, keys, T, H, HP, DH)
    s = tl.dot(q3, tl.permute(k3, (0, 2, 1)), input_precision=PREC)
    if MASK:
        s = tl.where(xm[None, :, :], s, 0.0)
    if HAS_BIAS:
        dist = rows[:, None] - keys[None, :] + T - 1
        ptr = TAB + hh[:, None, None] * (2 * T - 1) + dist[None, :, :]
        if MASK:
            bias = tl.load(ptr, mask=xm[None, :, :] & (hh < H)[:, None, None], other=0.0)
        else:
            bias = tl.load(ptr, mask=(hh < H)[:, None, None], other=0.0)
    else:
        bias = s
    return s, bias


@triton.jit
def _block(q3, K, V, TAB, W1, W2, b1, b2, b, skb, skh, skt, svb, svh, svt, rows, keys, T, scale,
           m_i, l_i, acc,
           H: tl.constexpr, HP: tl.constexpr, DH: tl.constexpr, CP: tl.constexpr, DP: tl.constexpr,
           KS: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
           PREC: tl.constexpr, CPREC: tl.constexpr, MASK: tl.constexpr):
    HALF: tl.constexpr = KS // 2
    P: tl.constexpr = BM * BN
    hh = tl.arange(0, HP)
    ee = tl.arange(0, DP)
    if HAS_BIAS:
        cs = 2 * hh
    else:
        cs = hh
    f = tl.zeros([HP, P], tl.float32)
    for s in tl.static_range(KS):
        y = tl.zeros([DP, P], tl.float32)
        for t in tl.static_range(KS):
            xs, xb = _inputs(q3, K, TAB, b, skb, skh, skt, rows, keys + (s + t - 2 * HALF), T,
                             H, HP, DH, HAS_BIAS, PREC, MASK)
            # the score scale folded into the weights of the score channels
            w1s = tl.load(W1 + t * CP * DP + cs[None, :] * DP + ee[:, None]) * scale  # [DP, HP]
            y += _cdot(w1s, tl.reshape(xs, (HP, P)), CPREC)
            if HAS_BIAS:
                w1b = tl.load(W1 + t * CP * DP + (cs + 1)[None, :] * DP + ee[:, None])
                y += _cdot(w1b, tl.reshape(xb, (HP, P)), CPREC)
        y += b1[:, None]
        z = tl.where(y > 0, y, 0.01 * y)
        if MASK:
            kz = keys + (s - HALF)
            zin = (kz >= 0) & (kz < T)  # conv2's zero padding
            z = tl.reshape(tl.where(zin[None, None, :], tl.reshape(z, (DP, BM, BN)), 0.0), (DP, P))
        w2 = tl.load(W2 + s * DP * HP + ee[None, :] * HP + hh[:, None])  # [HP, DP]
        f += _cdot(w2, z, CPREC)
    xs, xb = _inputs(q3, K, TAB, b, skb, skh, skt, rows, keys, T, H, HP, DH, HAS_BIAS, PREC, MASK)
    logit = tl.reshape(f, (HP, BM, BN)) + b2[:, None, None] + xs * scale
    if HAS_BIAS:
        logit += xb
    if MASK:
        valid = (keys[None, :] <= rows[:, None]) & (keys < T)[None, :] & (rows < T)[:, None]
        logit = tl.where(valid[None, :, :], logit, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(logit, 2))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(logit - m_new[:, :, None])
    l_i = l_i * alpha + tl.sum(p, 2)
    v3 = _load_heads(V, b, svb, svh, svt, keys, T, H, HP, DH)
    acc = acc * alpha[:, :, None] + tl.dot(p.to(v3.dtype), v3, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _dape_fwd_shifted(Q, K, V, TAB, W1, B1, W2, B2, O, LSE,
                      sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
                      T, scale,
                      H: tl.constexpr, HP: tl.constexpr, DH: tl.constexpr, CP: tl.constexpr, DP: tl.constexpr,
                      KS: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                      PREC: tl.constexpr, CPREC: tl.constexpr):
    HALF: tl.constexpr = KS // 2
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heavy (late) query blocks first
    b = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    hh = tl.arange(0, HP)
    ee = tl.arange(0, DP)
    q3 = _load_heads(Q, b, sqb, sqh, sqt, rows, T, H, HP, DH)
    b1 = tl.load(B1 + ee)
    b2 = tl.load(B2 + hh)
    m_i = tl.full([HP, BM], -1e30, tl.float32)
    l_i = tl.zeros([HP, BM], tl.float32)
    acc = tl.zeros([HP, BM, DH], tl.float32)
    last = tl.minimum(pid_m * BM + BM, T) - 1
    nn = tl.arange(0, BN)
    # blocks whose every shifted key is inside [0, T) and at or below every row need no masks
    lo = tl.cdiv(2 * HALF, BN) * BN
    hi = tl.maximum(((pid_m * BM - 2 * HALF + 1) // BN) * BN, lo)
    for n0 in range(0, lo, BN):
        if n0 <= last:
            m_i, l_i, acc = _block(q3, K, V, TAB, W1, W2, b1, b2, b, skb, skh, skt, svb, svh, svt, rows, n0 + nn,
                                   T, scale, m_i, l_i, acc, H, HP, DH, CP, DP, KS, HAS_BIAS, BM, BN, PREC, CPREC, True)
    for n0 in range(lo, hi, BN):
        m_i, l_i, acc = _block(q3, K, V, TAB, W1, W2, b1, b2, b, skb, skh, skt, svb, svh, svt, rows, n0 + nn,
                               T, scale, m_i, l_i, acc, H, HP, DH, CP, DP, KS, HAS_BIAS, BM, BN, PREC, CPREC, False)
    for n0 in range(hi, last + 1, BN):
        m_i, l_i, acc = _block(q3, K, V, TAB, W1, W2, b1, b2, b, skb, skh, skt, svb, svh, svt, rows, n0 + nn,
                               T, scale, m_i, l_i, acc, H, HP, DH, CP, DP, KS, HAS_BIAS, BM, BN, PREC, CPREC, True)
    out = acc / tl.maximum(l_i, 1e-30)[:, :, None]
    dd = tl.arange(0, DH)
    optr = O + b * sob + hh[:, None, None] * soh + rows[None, :, None] * sot + dd[None, None, :]
    tl.store(optr, out.to(O.dtype.element_ty), mask=(hh < H)[:, None, None] & (rows < T)[None, :, None])
    lptr = LSE + (b * H + hh[:, None]) * T + rows[None, :]
    tl.store(lptr, m_i + tl.log(tl.maximum(l_i, 1e-30)), mask=(hh < H)[:, None] & (rows < T)[None, :])


def dape_v2_forward_shifted(q, k, v, processor, table=None, BM=16, BN=16, num_warps=8, num_stages=1):
    """Forward only (out, lse), bf16 conv operands; arguments as lenx.ops.dape_v2.triton.dape_v2_triton."""
    import torch

    from .triton import _new, _new_like, _pack_weights, _precision, _shapes, _st

    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, H, T, DH = q.shape
    c1, c2 = processor.conv1, processor.conv2
    D, ks = c1.weight.shape[0], c1.weight.shape[-1]
    has_bias = table is not None
    sh = _shapes(H, D, ks, has_bias)
    W1, B1, W2, B2 = _pack_weights(c1.weight, c1.bias, c2.weight, c2.bias, H, D, ks, has_bias, sh["HP"], sh["CP"], sh["DP"])
    tab = table.detach().float().contiguous() if has_bias else W1
    out = _new_like(q)
    lse = _new((B, H, T), q, torch.float32)
    _dape_fwd_shifted[(triton.cdiv(T, BM), B)](
        q, k, v, tab, W1, B1, W2, B2, out, lse, *_st(q), *_st(k), *_st(v), *_st(out), T, DH ** -0.5,
        DH=DH, HAS_BIAS=has_bias, BM=BM, BN=BN, PREC=_precision(q.dtype),
        CPREC="ieee" if q.dtype == torch.float32 else "bf16",
        num_warps=num_warps, num_stages=num_stages, **sh)
    return out, lse
