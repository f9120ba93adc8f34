"""Fused stick-breaking attention (Tan et al. 2024), forward and backward in log space.

    log A_ij = logsigmoid(z_ij) - sum_{j<l, l allowed} softplus(z_il),   z = q k^T / sqrt(d)
    out_i = sum_j A_ij v_j,   rem_i = exp(-L_i),   L_i = sum_j softplus(z_ij)  (allowed keys only)

Forward: one program per (query block, batch x head) walks key blocks from the diagonal back to key
0, carrying each row's softplus sum over the blocks already seen (in fp64, see below); inside a
block the strict suffix sum is a reverse cumsum.

Backward: one program per query block walks the key blocks the other way, from key 0 up to the
diagonal, because the gradient needs prefix sums. With g_ij = A_ij (dO_i . v_j):

    dz_ij = g_ij (1 - beta_ij) - beta_ij (sum_{m<j} g_im + drem_i rem_i),   beta = sigmoid(z)

The prefix sum of g is exact and tiny for far keys, which matters: any per-row error in it is
multiplied by sum_j beta_ij k_j over the whole row. A_ij is rebuilt from the forward's total
L_i minus the prefix of softplus; L_i and that prefix are kept in fp64 so the difference has no
cancellation error at long T. dK/dV belong to other programs: they are added with fp32 atomic adds
(no locks; the summation order, and so the last bits, can vary between runs).
"""

import os

import torch
import triton
import triton.language as tl

POISON = bool(os.environ.get("LENX_TRITON_POISON"))


def _new(shape, like, dtype=None):
    dtype = like.dtype if dtype is None else dtype
    if POISON:
        return torch.full(shape, float("nan"), dtype=dtype, device=like.device)
    return torch.empty(shape, dtype=dtype, device=like.device)


@triton.jit
def _softplus_parts(z):
    """(softplus(z), log(1 + e^-|z|), e^-|z|): shared pieces of softplus, logsigmoid and sigmoid."""
    e = tl.exp(-tl.abs(z))
    l1 = tl.log(1.0 + e)
    return tl.maximum(z, 0.0) + l1, l1, e


@triton.jit
def _sb_fwd(Q, K, V, O, REM, LTOT,
            sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
            T, scale,
            H: tl.constexpr, DH: tl.constexpr, CURRENT: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = pid_m * BM + tl.arange(0, BM)
    rmask = rows < T
    dd = tl.arange(0, DH)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=rmask[:, None], other=0.0)
    acc = tl.zeros([BM, DH], tl.float32)
    carry = tl.zeros([BM], tl.float64)  # softplus sum over the keys already walked (nearer the diagonal)
    n_blocks = tl.cdiv(tl.minimum((pid_m + 1) * BM, T), BN)
    for it in range(0, n_blocks):
        n0 = (n_blocks - 1 - it) * BN
        cols = n0 + tl.arange(0, BN)
        cmask = cols < T
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dd[None, :], mask=cmask[:, None], other=0.0)
        z = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        if CURRENT:
            allowed = cols[None, :] <= rows[:, None]
        else:
            allowed = cols[None, :] < rows[:, None]
        allowed = allowed & cmask[None, :] & rmask[:, None]
        sp, l1, e = _softplus_parts(z)
        sp = tl.where(allowed, sp, 0.0)
        # strict suffix inside the block: reverse inclusive cumsum minus the entry itself
        suffix = tl.cumsum(sp, 1, reverse=True) - sp + carry.to(tl.float32)[:, None]
        log_a = tl.minimum(z, 0.0) - l1 - suffix  # logsigmoid(z) = min(z, 0) - log(1 + e^-|z|)
        a = tl.where(allowed, tl.exp(log_a), 0.0)
        v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + dd[None, :], mask=cmask[:, None], other=0.0)
        acc += tl.dot(a.to(v.dtype), v, input_precision=PREC)
        carry += tl.sum(sp, 1).to(tl.float64)
    tl.store(O + b * sob + h * soh + rows[:, None] * sot + dd[None, :], acc.to(O.dtype.element_ty), mask=rmask[:, None])
    tl.store(REM + bh * T + rows, tl.exp(-carry.to(tl.float32)), mask=rmask)
    tl.store(LTOT + bh * T + rows, carry, mask=rmask)


@triton.jit
def _sb_bwd(Q, K, V, DO, DREM, REM, LTOT, DQ, DK, DV,
            sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
            T, scale,
            H: tl.constexpr, DH: tl.constexpr, CURRENT: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = pid_m * BM + tl.arange(0, BM)
    rmask = rows < T
    dd = tl.arange(0, DH)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=rmask[:, None], other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdt + dd[None, :], mask=rmask[:, None], other=0.0)
    total = tl.load(LTOT + bh * T + rows, mask=rmask, other=0.0)  # fp64
    c = tl.load(DREM + bh * T + rows, mask=rmask, other=0.0) * tl.load(REM + bh * T + rows, mask=rmask, other=0.0)
    pre_sp = tl.zeros([BM], tl.float64)  # softplus sum over the keys before this block
    pre_g = tl.zeros([BM], tl.float32)  # sum of g over the keys before this block
    dq = tl.zeros([BM, DH], tl.float32)
    n_blocks = tl.cdiv(tl.minimum((pid_m + 1) * BM, T), BN)
    for it in range(0, n_blocks):
        cols = it * BN + tl.arange(0, BN)
        cmask = cols < T
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skt + dd[None, :], mask=cmask[:, None], other=0.0)
        v = tl.load(V + b * svb + h * svh + cols[:, None] * svt + dd[None, :], mask=cmask[:, None], other=0.0)
        z = tl.dot(q, tl.trans(k), input_precision=PREC) * scale
        if CURRENT:
            allowed = cols[None, :] <= rows[:, None]
        else:
            allowed = cols[None, :] < rows[:, None]
        allowed = allowed & cmask[None, :] & rmask[:, None]
        sp, l1, e = _softplus_parts(z)
        sp = tl.where(allowed, sp, 0.0)
        blk = tl.sum(sp, 1)
        after = (total - pre_sp - blk.to(tl.float64)).to(tl.float32)  # softplus sum past this block
        suffix = tl.cumsum(sp, 1, reverse=True) - sp + after[:, None]
        a = tl.where(allowed, tl.exp(tl.minimum(z, 0.0) - l1 - suffix), 0.0)
        da = tl.dot(do, tl.trans(v), input_precision=PREC)
        g = a * da
        prefix = tl.cumsum(g, 1) - g + pre_g[:, None]  # strict prefix sum of g
        inv = 1.0 / (1.0 + e)
        beta = tl.where(z >= 0, inv, e * inv)
        dz = g * (1.0 - beta) - beta * (prefix + c[:, None])
        dz = tl.where(allowed, dz, 0.0)
        dq += tl.dot(dz.to(k.dtype), k, input_precision=PREC)
        dk_part = tl.dot(tl.trans(dz).to(q.dtype), q, input_precision=PREC) * scale
        dv_part = tl.dot(tl.trans(a).to(do.dtype), do, input_precision=PREC)
        kv_off = bh * T * DH + cols[:, None] * DH + dd[None, :]  # DK, DV: contiguous fp32 buffers
        tl.atomic_add(DK + kv_off, dk_part, mask=cmask[:, None])
        tl.atomic_add(DV + kv_off, dv_part, mask=cmask[:, None])
        pre_sp += blk.to(tl.float64)
        pre_g += tl.sum(g, 1)
    tl.store(DQ + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=rmask[:, None])


def _strides(x):
    return x.stride(0), x.stride(1), x.stride(2)


# (BM, BN, num_warps): the fastest of lenx.bench.tile_sweep's candidates on an H200 at T = 8192
CONFIG = {"fwd": (64, 32, 4), "bwd": (128, 64, 8)}


class StickBreakingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, attend_current):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        B, H, T, DH = q.shape
        out = _new(q.shape, q)
        rem = _new((B, H, T), q, torch.float32)
        total = _new((B, H, T), q, torch.float64)
        BM, BN, nw = CONFIG["fwd"]
        prec = "ieee" if q.dtype == torch.float32 else "tf32"
        _sb_fwd[(triton.cdiv(T, BM), B * H)](
            q, k, v, out, rem, total, *_strides(q), *_strides(k), *_strides(v), *_strides(out),
            T, DH ** -0.5, H=H, DH=DH, CURRENT=bool(attend_current), BM=BM, BN=BN, PREC=prec, num_warps=nw)
        ctx.save_for_backward(q, k, v, rem, total)
        ctx.attend_current = bool(attend_current)
        ctx.mark_non_differentiable(total)
        return out, rem

    @staticmethod
    def backward(ctx, dout, drem):
        q, k, v, rem, total = ctx.saved_tensors
        B, H, T, DH = q.shape
        dout = torch.zeros_like(q) if dout is None else dout.contiguous()
        drem = torch.zeros_like(rem) if drem is None else drem.float().contiguous()
        dq = _new(q.shape, q)
        # dK/dV are summed over query blocks by atomic adds: they must start at zero.
        dk = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dv = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        BM, BN, nw = CONFIG["bwd"]
        prec = "ieee" if q.dtype == torch.float32 else "tf32"
        _sb_bwd[(triton.cdiv(T, BM), B * H)](
            q, k, v, dout, drem, rem, total, dq, dk, dv,
            *_strides(q), *_strides(k), *_strides(v), *_strides(dout),
            T, DH ** -0.5, H=H, DH=DH, CURRENT=ctx.attend_current, BM=BM, BN=BN, PREC=prec, num_warps=nw)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None


def stickbreaking_triton(q, k, v, attend_current: bool = False):
    """Stick-breaking attention, q, k, v [B, H, T, d] (d in 16/32/64/128) -> (out, rem), as
    lenx.ops.stickbreaking.reference.stickbreaking_reference (out in v's dtype, rem fp32)."""
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must all be [B, H, T, d], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-1] not in (16, 32, 64, 128):
        raise ValueError(f"the stick-breaking kernel takes head dims 16, 32, 64 or 128, got {q.shape[-1]}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one of fp16/bf16/fp32, got {q.dtype}, {k.dtype}, {v.dtype}")
    return StickBreakingAttention.apply(q, k, v, attend_current)
