"""Fused causal softmax attention with a per-distance bias table: the DAPE V2 kernel with its
processor switched off (Kerple, ALiBi, T5, or no bias at all).

    out = softmax_causal(Q K^T / sqrt(d) + table[h, i - j + T - 1]) V

Flash-attention layout: one program per (query block, batch x head); online softmax; never a
T x T tensor. Backward: a key-owner kernel for dK/dV and a query-owner kernel for dQ and the
table gradient (no locks; the table gradient is summed per diagonal inside a tile first, so a tile
issues BM + BN atomic adds instead of BM * BN).
"""

import os

import torch
import triton
import triton.language as tl

# Debug switch for the tests: outputs that would be torch.empty start as NaN instead, so an element
# the kernel forgets to write fails the comparison.
POISON = bool(os.environ.get("LENX_TRITON_POISON"))


def _new(shape, like, dtype=None):
    dtype = like.dtype if dtype is None else dtype
    if POISON:
        return torch.full(shape, float("nan"), dtype=dtype, device=like.device)
    return torch.empty(shape, dtype=dtype, device=like.device)


def _new_like(x):
    """Same shape and strides as x (so a gradient can reuse x's strides in the kernel)."""
    return torch.full_like(x, float("nan")) if POISON else torch.empty_like(x)


def _precision(dtype) -> str:
    # fp32 inputs get exact fp32 products (the tests hold them to ~1e-5); bf16/fp16 use tensor cores.
    return "ieee" if dtype == torch.float32 else "tf32"


@triton.jit
def _diag_sums(x, BM: tl.constexpr, BN: tl.constexpr, E: tl.constexpr):
    """x [BM, BN] -> [E]: entry e sums x[r, c] over r - c = e - (BN - 1), i.e. per distance.
    For row r, e maps to column c = r + BN - 1 - e; a gather along the columns lines the
    diagonals up, then the rows are summed."""
    r = tl.arange(0, BM)[:, None]
    e = tl.arange(0, E)[None, :]
    c = r + (BN - 1) - e
    ok = (c >= 0) & (c < BN)
    g = tl.gather(x, tl.where(ok, c, 0), 1)  # [BM, E]
    return tl.sum(tl.where(ok, g, 0.0), 0)


@triton.jit
def _bias_fwd(Q, K, V, TAB, O, LSE,
              sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
              T, scale,
              H: tl.constexpr, HAS_BIAS: tl.constexpr, DH: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = pid_m * BM + tl.arange(0, BM)
    rmask = rows < T
    dd = tl.arange(0, DH)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=rmask[:, None], other=0.0)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, DH], tl.float32)
    hi = tl.minimum((pid_m + 1) * BM, T)
    # Key 0 lies in the first tile and is allowed for every row (padding rows too), so m_i is
    # finite after the first tile and exp(m_i - m_new) never sees inf - inf.
    for n0 in range(0, hi, BN):
        cols = n0 + tl.arange(0, BN)
        cmask = cols < T
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dd[None, :], mask=cmask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        valid = (cols[None, :] <= rows[:, None]) & cmask[None, :]
        if HAS_BIAS:
            idx = rows[:, None] - cols[None, :] + T - 1
            s += tl.load(TAB + h * (2 * T - 1) + idx, mask=valid & rmask[:, None], other=0.0)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + dd[None, :], mask=cmask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(O + b * sob + h * soh + rows[:, None] * sot + dd[None, :], out.to(O.dtype.element_ty), mask=rmask[:, None])
    tl.store(LSE + bh * T + rows, m_i + tl.log(l_i), mask=rmask)


@triton.jit
def _bias_bwd_dkdv(Q, K, V, TAB, DO, LSE, DELTA, DK, DV,
                   sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                   T, scale,
                   H: tl.constexpr, HAS_BIAS: tl.constexpr, DH: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    """One program owns a block of keys and walks the query blocks at and below the diagonal.
    Works on transposed tiles [keys, queries] so no register transposes are needed."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    cols = pid_n * BN + tl.arange(0, BN)
    cmask = cols < T
    dd = tl.arange(0, DH)
    k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dd[None, :], mask=cmask[:, None], other=0.0)
    v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + dd[None, :], mask=cmask[:, None], other=0.0)
    dk = tl.zeros([BN, DH], tl.float32)
    dv = tl.zeros([BN, DH], tl.float32)
    for m0 in range((pid_n * BN // BM) * BM, T, BM):
        rows = m0 + tl.arange(0, BM)
        rmask = rows < T
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=rmask[:, None], other=0.0)
        do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdt + dd[None, :], mask=rmask[:, None], other=0.0)
        lse = tl.load(LSE + bh * T + rows, mask=rmask, other=0.0)
        delta = tl.load(DELTA + bh * T + rows, mask=rmask, other=0.0)
        st = tl.dot(k, tl.trans(q), input_precision=PREC) * scale  # [BN, BM]
        valid = (cols[:, None] <= rows[None, :]) & rmask[None, :] & cmask[:, None]
        if HAS_BIAS:
            st += tl.load(TAB + h * (2 * T - 1) + rows[None, :] - cols[:, None] + T - 1, mask=valid, other=0.0)
        pt = tl.where(valid, tl.exp(st - lse[None, :]), 0.0)
        dv += tl.dot(pt.to(do.dtype), do, input_precision=PREC)
        dpt = tl.dot(v, tl.trans(do), input_precision=PREC)
        dst = pt * (dpt - delta[None, :])
        dk += tl.dot(dst.to(q.dtype), q, input_precision=PREC)
    tl.store(DK + b * skb + h * skh + cols[:, None] * skt + dd[None, :], (dk * scale).to(DK.dtype.element_ty), mask=cmask[:, None])
    tl.store(DV + b * svb + h * svh + cols[:, None] * svt + dd[None, :], dv.to(DV.dtype.element_ty), mask=cmask[:, None])


@triton.jit
def _bias_bwd_dq(Q, K, V, TAB, DO, LSE, DELTA, DQ, DTAB,
                 sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                 T, scale,
                 H: tl.constexpr, HAS_BIAS: tl.constexpr, NEED_DTAB: tl.constexpr, DH: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, E: tl.constexpr, PREC: tl.constexpr):
    """One program owns a block of queries: dQ, and the bias-table gradient (the table gradient of
    entry (i, j) is dS_ij itself, summed over each diagonal i - j)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = pid_m * BM + tl.arange(0, BM)
    rmask = rows < T
    dd = tl.arange(0, DH)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=rmask[:, None], other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdt + dd[None, :], mask=rmask[:, None], other=0.0)
    lse = tl.load(LSE + bh * T + rows, mask=rmask, other=0.0)
    delta = tl.load(DELTA + bh * T + rows, mask=rmask, other=0.0)
    dq = tl.zeros([BM, DH], tl.float32)
    ee = tl.arange(0, E)
    hi = tl.minimum((pid_m + 1) * BM, T)
    for n0 in range(0, hi, BN):
        cols = n0 + tl.arange(0, BN)
        cmask = cols < T
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dd[None, :], mask=cmask[:, None], other=0.0)
        v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + dd[None, :], mask=cmask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        valid = (cols[None, :] <= rows[:, None]) & cmask[None, :] & rmask[:, None]
        if HAS_BIAS:
            s += tl.load(TAB + h * (2 * T - 1) + rows[:, None] - cols[None, :] + T - 1, mask=valid, other=0.0)
        p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
        if NEED_DTAB:
            sums = _diag_sums(ds, BM, BN, E)
            dist = pid_m * BM - n0 + ee - (BN - 1)  # i - j of entry e
            ok = (ee < BM + BN - 1) & (dist >= 0) & (dist < T)
            tl.atomic_add(DTAB + h * (2 * T - 1) + dist + T - 1, sums, mask=ok)
    tl.store(DQ + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=rmask[:, None])


def _strides(x):
    return x.stride(0), x.stride(1), x.stride(2)


def _prep(x):
    # Inputs and their gradients share one contiguous layout (a strided view, e.g. q sliced out of
    # a fused qkv projection, is copied once: O(T) and cheap next to the attention itself).
    return x.contiguous()


# (BM, BN, num_warps): the fastest of lenx.bench.tile_sweep's candidates on an H200 at T = 8192
CONFIG = {"fwd": (64, 64, 4), "dkdv": (64, 64, 4), "dq": (64, 64, 4)}


class BiasedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table):
        q, k, v = _prep(q), _prep(k), _prep(v)
        B, H, T, DH = q.shape
        has_bias = table is not None
        tab = table.detach().float().contiguous() if has_bias else q  # dummy pointer when unused
        out = _new((B, H, T, DH), q)
        lse = _new((B, H, T), q, torch.float32)
        BM, BN, nw = CONFIG["fwd"]
        grid = (triton.cdiv(T, BM), B * H)
        _bias_fwd[grid](q, k, v, tab, out, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(out),
                        T, DH ** -0.5, H=H, HAS_BIAS=has_bias, DH=DH, BM=BM, BN=BN,
                        PREC=_precision(q.dtype), num_warps=nw)
        ctx.save_for_backward(q, k, v, tab, out, lse)
        ctx.has_bias = has_bias
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, tab, out, lse = ctx.saved_tensors
        B, H, T, DH = q.shape
        dout = _prep(dout)
        delta = (dout.float() * out.float()).sum(-1).contiguous()  # rowsum(dO * O), [B, H, T]
        # Gradients are contiguous like the saved inputs, so the kernels reuse q/k/v strides for them.
        dq, dk, dv = _new_like(q), _new_like(k), _new_like(v)
        prec = _precision(q.dtype)
        scale = DH ** -0.5
        need_dtab = ctx.has_bias and ctx.needs_input_grad[3]
        dtab = torch.zeros(H, 2 * T - 1, dtype=torch.float32, device=q.device) if need_dtab else q
        BM, BN, nw = CONFIG["dkdv"]
        _bias_bwd_dkdv[(triton.cdiv(T, BN), B * H)](
            q, k, v, tab, dout, lse, delta, dk, dv, *_strides(q), *_strides(k), *_strides(v), *_strides(dout),
            T, scale, H=H, HAS_BIAS=ctx.has_bias, DH=DH, BM=BM, BN=BN, PREC=prec, num_warps=nw)
        BM, BN, nw = CONFIG["dq"]
        _bias_bwd_dq[(triton.cdiv(T, BM), B * H)](
            q, k, v, tab, dout, lse, delta, dq, dtab, *_strides(q), *_strides(k), *_strides(v), *_strides(dout),
            T, scale, H=H, HAS_BIAS=ctx.has_bias, NEED_DTAB=need_dtab, DH=DH, BM=BM, BN=BN,
            E=triton.next_power_of_2(BM + BN - 1), PREC=prec, num_warps=nw)
        return dq, dk, dv, (dtab if need_dtab else None)


def biased_attention(q, k, v, table=None):
    """Causal softmax attention of q, k, v [B, H, T, d] with an optional per-distance bias table
    [H, 2T - 1] (entry (i - j) + T - 1, as DistanceBias.table(T) gives). Differentiable in all
    four; the table gradient flows on to the bias module's parameters."""
    _check(q, k, v)
    if table is not None and tuple(table.shape) != (q.shape[1], 2 * q.shape[2] - 1):
        raise ValueError(f"bias table must be [H, 2T - 1] = [{q.shape[1]}, {2 * q.shape[2] - 1}], got {tuple(table.shape)}")
    return BiasedAttention.apply(q, k, v, table)


def _check(q, k, v):
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must all be [B, H, T, d], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-1] not in (16, 32, 64, 128):
        raise ValueError(f"the fused kernels take head dims 16, 32, 64 or 128, got {q.shape[-1]}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one of fp16/bf16/fp32, got {q.dtype}, {k.dtype}, {v.dtype}")
