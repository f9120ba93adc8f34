"""DAPE V2 causal attention forward as one chain per query block, in Gluon for Hopper (sm_90a, triton
3.6's Gluon API, as gluon.py): for BM query rows of one batch entry, every head's QK once per key window,
conv1, LeakyReLU, conv2, then the online softmax and PV, all on chip; it writes only O and LSE.
Nothing T x T exists, so evaluation at any length runs in one launch with the host tables cached
(tables.cached; a chunk of query rows per launch would add launches and save nothing).

It is gluon.py's forward (same windows, row loop and helpers, imported from there) with the scores
computed once: step 1 keeps each head's fp16 S (the conv input it already made) in a shared-memory
buffer, and step 3 reads it back instead of recomputing Q K^T in fp32, so step 3 streams V only (no
K tiles, no second wgmma per head). The logits then hold fp16 S (|error| <= |S| 2^-11, below bf16 P's
2^-9); emulate_chain.chain_schedule is this schedule on the CPU, tested against the float64 reference.
Why Gluon: a conv tap is a key shift of an on-chip tile; Triton can only gather registers (which
spilled) or recompute QK per tap (1.6x slower; notes/kernels.md), Gluon shifts by register renames.

K and V tiles stream through a ring of RING single tiles, RING - 1 of them in flight (2 by default; 3
and 4 keep more of the L2 latency off step 1's and step 3's chain, for timing: notes/kernels.md, issue
45 step 4). The ring changes when tiles arrive, never what is computed: every ring gives the same bits.

Limits: d 64, H <= 12 (shared memory: the S buffer takes 2 KB a head), D <= 32, k in (1, 3), bf16.
"""

import math

from .gluon import BM, BNW, CS, NUM_WARPS, _GLUON_ERROR, _aligned, prepare

MAX_HEADS = 12


if _GLUON_ERROR is None:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import async_copy, fence_async_shared, warpgroup_mma

    from .gluon import (_col_key, _conv_rows, _lane_shift, _load_T, _rescale_add, _slot_key, _slot_run,
                        _tapsum, _thread_barrier, _unpack16, _warp_max, _warp_sums)

    @gluon.jit
    def _load1(ring, slot: gl.constexpr, ptr, ok):
        """Start the copy of one [64, 64] tile (a head's K or V, zero-filled outside [0, T)) into ring
        slot `slot` as one commit group."""
        async_copy.async_copy_global_to_shared(ring[slot], ptr, mask=ok)
        async_copy.commit_group()

    @gluon.jit
    def _ready1(ring, slot: gl.constexpr, PENDING: gl.constexpr):
        """Wait until at most PENDING commit groups are in flight (this item's has landed; the next
        PENDING items' stay in flight), make every thread's copies visible to the tensor cores."""
        async_copy.wait_group(PENDING)
        _thread_barrier()
        fence_async_shared()
        return ring[slot]

    @gluon.jit
    def _issue(ring, i: gl.constexpr, H: gl.constexpr, RING: gl.constexpr, Kb, Vb, k_off, v_off, k_keys, skh, svh,
               skt, T, STEP: gl.constexpr):
        """Start ring item i of a window into slot i % RING: K_i (i < H), V_(i - H) (i < 2 H), else K_(i - 2 H)
        of the next window (STEP keys on). Kb, Vb: this batch entry's K and V; k_off, v_off: the window's
        int32 element offsets, k_keys its keys (fewer live registers than pointers and masks).
        2 H % RING == 0 keeps every slot a compile-time constant; RING - 1 <= H keeps i < 3 H."""
        if i < H:
            _load1(ring, i % RING, (Kb + i * skh) + k_off, ((k_keys >= 0) & (k_keys < T))[:, None])
        elif i < 2 * H:
            _load1(ring, i % RING, (Vb + (i - H) * svh) + v_off, ((k_keys >= 0) & (k_keys < T))[:, None])
        else:
            _load1(ring, i % RING, (Kb + (i - 2 * H) * skh + STEP * skt) + k_off,
                   ((k_keys + STEP >= 0) & (k_keys + STEP < T))[:, None])

    @gluon.jit
    def _dape_v2_chain(Q, K, V, W1A, W2A, T1, K0, T2, O, LSE,
                       sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
                       T, scale,
                       H: gl.constexpr, D: gl.constexpr, KS: gl.constexpr, BM: gl.constexpr,
                       RING: gl.constexpr, num_warps: gl.constexpr):
        HALF: gl.constexpr = KS // 2
        STEP: gl.constexpr = 64 - 4 * HALF
        LOG2E: gl.constexpr = 1.4426950408889634
        pid_m = gl.num_programs(0) - 1 - gl.program_id(0)  # late (heavy) query blocks first
        b = gl.program_id(1)
        q0 = pid_m * BM

        LD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])          # [R, 64] global loads
        ACC_S: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                        instr_shape=[16, BM // 2, 16])  # [64, BM] S^T, O^T
        ACC_Y: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                        instr_shape=[16, 64, 16])      # [128, 128] convs
        OPA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC_Y, k_width=2)
        LF3: gl.constexpr = gl.BlockedLayout([1, 1, 2], [1, 1, 32], [8, 1, 1], [2, 1, 0])  # [BM, 1, 64]
        SROW: gl.constexpr = gl.SliceLayout(0, ACC_S)
        SKEY: gl.constexpr = gl.SliceLayout(1, ACC_S)

        PLAIN1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        PLAIN2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        PLAIN3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
        NV64: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
        Qs = gl.allocate_shared_memory(gl.bfloat16, [H, BM, 64], gl.NVMMASharedLayout.get_default_for([BM, 64], gl.bfloat16))
        # a ring of RING single tiles, RING - 1 of them in flight: K_h in step 1, V_h in step 3 (one
        # allocation each, as gluon.py: in one allocation the compiler put a barrier after every copy)
        if RING == 4:
            ring = (gl.allocate_shared_memory(gl.bfloat16, [64, 64], NV64), gl.allocate_shared_memory(gl.bfloat16, [64, 64], NV64),
                    gl.allocate_shared_memory(gl.bfloat16, [64, 64], NV64), gl.allocate_shared_memory(gl.bfloat16, [64, 64], NV64))
        elif RING == 3:
            ring = (gl.allocate_shared_memory(gl.bfloat16, [64, 64], NV64), gl.allocate_shared_memory(gl.bfloat16, [64, 64], NV64),
                    gl.allocate_shared_memory(gl.bfloat16, [64, 64], NV64))
        else:
            ring = (gl.allocate_shared_memory(gl.bfloat16, [64, 64], NV64), gl.allocate_shared_memory(gl.bfloat16, [64, 64], NV64))
        Pb = gl.allocate_shared_memory(gl.bfloat16, [64, BM], gl.NVMMASharedLayout.get_default_for([64, BM], gl.bfloat16))
        Xb = gl.allocate_shared_memory(gl.float16, [16, 128], gl.NVMMASharedLayout.get_default_for([16, 128], gl.float16))
        Zb = gl.allocate_shared_memory(gl.float16, [32, 128], gl.NVMMASharedLayout.get_default_for([32, 128], gl.float16))
        XF = gl.allocate_shared_memory(gl.float16, [BM, 32, 64], PLAIN3)  # conv1 input, then f (gluon.py)
        XFpair = XF._reinterpret(gl.float16, [BM // 2, 64, 64], PLAIN2)
        Ss = gl.allocate_shared_memory(gl.float16, [H, BM, 1, 64], PLAIN3)  # S_h (fp16) for the logits
        Os = gl.allocate_shared_memory(gl.float32, [H, 64, BM], PLAIN2)
        Ms = gl.allocate_shared_memory(gl.float32, [H, BM], PLAIN1)
        Mx = gl.allocate_shared_memory(gl.float32, [2, 4, BM], PLAIN2)
        Mxr = Mx._reinterpret(gl.float32, [8, BM], PLAIN1)
        Ls = gl.allocate_shared_memory(gl.float32, [H, 4, BM], PLAIN2)

        r128 = gl.arange(0, 128, gl.SliceLayout(1, LD))
        w1 = gl.allocate_shared_memory(gl.float16, [128, 16], gl.NVMMASharedLayout.get_default_for([128, 16], gl.float16))
        w1.store(gl.load(W1A + r128[:, None] * 16 + gl.arange(0, 16, gl.SliceLayout(0, LD))[None, :]))
        w2 = gl.allocate_shared_memory(gl.float16, [128, 32], gl.NVMMASharedLayout.get_default_for([128, 32], gl.float16))
        w2.store(gl.load(W2A + r128[:, None] * 32 + gl.arange(0, 32, gl.SliceLayout(0, LD))[None, :]))

        for h in gl.static_range(H):
            Os.index(h).store(gl.zeros([64, BM], gl.float32, ACC_S))
            Ms.index(h).store(gl.full([BM], -1.0e30, gl.float32, SROW))
            Ls.index(h).store(_warp_sums(gl.zeros([64, BM], gl.float32, ACC_S)))
        for h in gl.static_range(H, 16):
            XF.slice(h, 1, dim=1).store(gl.zeros([BM, 1, 64], gl.float16, LF3))

        ld_r = gl.arange(0, BM, gl.SliceLayout(1, LD))
        ld_n = gl.arange(0, 64, gl.SliceLayout(1, LD))
        ld_d = gl.arange(0, 64, gl.SliceLayout(0, LD))
        q_rows = q0 + ld_r
        q_ok = (q_rows < T)[:, None]
        for h in gl.static_range(H):
            Qs.index(h).store(gl.load(Q + b * sqb + h * sqh + q_rows[:, None] * sqt + ld_d[None, :], mask=q_ok, other=0.0))
        s_n = gl.arange(0, 64, SKEY)
        s_off = _col_key(s_n)
        s_rows = q0 + gl.arange(0, BM, SROW)
        inner = (s_off >= 2 * HALF) & (s_off < 64 - 2 * HALF)
        like = gl.zeros([64, BM], gl.float32, ACC_S)   # the layout _load_T reads S and f in

        # ring items, RING - 1 ahead: K_h of step 1 (n = 2 H w + h), V_h of step 3 (n = 2 H w + H + h); slot n % RING
        ws = -2 * HALF
        k_keys = ws + _col_key(ld_n)
        k_off = k_keys[:, None] * skt + ld_d[None, :]
        for i in gl.static_range(RING - 1):
            _issue(ring, i, H, RING, K + b * skb, V + b * svb, k_off, k_off, k_keys, skh, svh, skt, T, STEP)

        y0 = _tapsum(gl.zeros([128, 128], gl.float32, ACC_Y), KS)
        pp, cc, key0 = _slot_key(y0)
        pp2, cc2, q2 = _slot_run(_lane_shift(_unpack16(y0)[15], -1))

        last = gl.minimum(q0 + BM, T) - 1
        for ws in range(-2 * HALF, last - 2 * HALF + 1, STEP):
            k_keys = ws + _col_key(ld_n)
            k_off = k_keys[:, None] * skt + ld_d[None, :]
            v_off = k_keys[:, None] * svt + ld_d[None, :]
            s_keys = ws + s_off
            tril = (s_keys[:, None] <= s_rows[None, :]) & (s_keys >= 0)[:, None] & (s_keys < T)[:, None]
            t2_ptr = T2 + (s_rows[None, :] - s_keys[:, None] + T - 1)

            # 1. scores of every head, once: conv1's input (XF) and the logits' S (Ss), fp16, tril applied
            for h in gl.static_range(H):
                _thread_barrier()   # the slot of item h + RING - 1 is free: its last reader (item h - 1) is done
                _issue(ring, h + RING - 1, H, RING, K + b * skb, V + b * svb, k_off, v_off, k_keys, skh, svh, skt, T, STEP)
                kb = _ready1(ring, h % RING, RING - 1)
                sT = warpgroup_mma(kb, Qs.index(h).permute((1, 0)), gl.zeros([64, BM], gl.float32, ACC_S), use_acc=False)
                sT = gl.where(tril, sT * scale, 0.0)
                x = gl.reshape(gl.permute(sT.to(gl.float16), (1, 0)), [BM, 1, 64])
                XF.slice(h, 1, dim=1).store(x)
                Ss.index(h).store(x)
            _thread_barrier()

            # 2. per query row pair: conv1 -> tap sum -> t1, k0 -> LeakyReLU -> conv2 -> tap sum -> f (gluon.py)
            if HALF > 0:
                if ws < HALF:
                    _conv_rows(XFpair, Xb, Zb, w1, w2, T1, K0, pp, cc, key0, pp2, cc2, q2, q0, ws, T, D, KS, BM, True)
                else:
                    _conv_rows(XFpair, Xb, Zb, w1, w2, T1, K0, pp, cc, key0, pp2, cc2, q2, q0, ws, T, D, KS, BM, False)
            else:
                _conv_rows(XFpair, Xb, Zb, w1, w2, T1, K0, pp, cc, key0, pp2, cc2, q2, q0, ws, T, D, KS, BM, False)
            _thread_barrier()

            # 3. per head: logits from the stored S and f, online softmax, O^T += V^T P^T
            valid = tril & inner[:, None] & (s_rows < T)[None, :]
            t2n = gl.load(t2_ptr, mask=valid, other=0.0)
            for h in gl.static_range(H):
                t2 = t2n
                if h + 1 < H:
                    t2n = gl.load(t2_ptr + (h + 1) * (2 * T - 1), mask=valid, other=0.0)
                _thread_barrier()
                _issue(ring, H + h + RING - 1, H, RING, K + b * skb, V + b * svb, k_off, v_off, k_keys, skh, svh, skt, T, STEP)
                vb = _ready1(ring, (H + h) % RING, RING - 1)
                sT = _load_T(Ss.index(h), like)
                fT = _load_T(XF.slice(h, 1, dim=1), like)
                lg = gl.where(valid, sT.to(gl.float32) + t2 + fT.to(gl.float32), float("-inf"))
                m_old = Ms.index(h).load(SROW)
                Mx.index(h % 2).store(_warp_max(lg))
                _thread_barrier()
                m_new = gl.maximum(gl.maximum(m_old, gl.maximum(Mxr.index(4 * (h % 2)).load(SROW), Mxr.index(4 * (h % 2) + 1).load(SROW))),
                                   gl.maximum(Mxr.index(4 * (h % 2) + 2).load(SROW), Mxr.index(4 * (h % 2) + 3).load(SROW)))
                alpha = gl.exp2((m_old - m_new) * LOG2E)
                p = gl.exp2((lg - m_new[None, :]) * LOG2E)
                l_new = _rescale_add(Ls.index(h), alpha, _warp_sums(p))
                Pb.store(p.to(gl.bfloat16))
                o = Os.index(h).load(ACC_S) * alpha[None, :]
                _thread_barrier()
                fence_async_shared()
                o = warpgroup_mma(vb.permute((1, 0)), Pb, o)
                Os.index(h).store(o)
                Ms.index(h).store(m_new)
                Ls.index(h).store(l_new)
            _thread_barrier()
        async_copy.wait_group(0)  # the prefetch of a window past the last

        s_d = gl.arange(0, 64, SKEY)
        r_ok = s_rows < T
        for h in gl.static_range(H):
            o = Os.index(h).load(ACC_S)
            m = Ms.index(h).load(SROW)
            lw = Ls.index(h).load(_warp_sums(o).type.layout)
            l = gl.maximum(gl.convert_layout(gl.sum(lw, axis=0), SROW), 1e-30)
            o = o / l[None, :]
            gl.store(O + b * sob + h * soh + s_rows[None, :] * sot + s_d[:, None], o.to(gl.bfloat16),
                     mask=r_ok[None, :])
            gl.store(LSE + (b * H + h) * T + s_rows, m + gl.log(l), mask=r_ok)


def kernel():
    """The Gluon kernel (needs triton with a 3.6-compatible Gluon)."""
    if _GLUON_ERROR is not None:
        raise RuntimeError(f"triton Gluon (Hopper) unavailable: {_GLUON_ERROR!r}")
    return _dape_v2_chain


def unsupported_reason(q, H: int, D: int, ks: int):
    """Why the chain cannot run for q [B, H, T, d], D hidden channels and kernel size ks, or None:
    gluon.py's conditions (sm_90, triton 3.6, d 64, D <= 32, k in (1, 3), bf16) and H <= 12."""
    from .gluon import unsupported_reason as gluon_reason

    why = gluon_reason(q, H, D, ks)
    if why is None and H > MAX_HEADS:
        why = f"the forward chain takes H <= {MAX_HEADS} (got {H})"
    return why


def ring_sizes(H: int) -> tuple:
    """The K/V ring sizes the kernel takes at H heads: a ring of R slots keeps R - 1 tiles in flight;
    R must divide 2 H (the items of a window: every item's slot a compile-time constant) and R - 1 <= H
    (the items ahead reach no further than the next window's K). 2 is the default (one tile ahead)."""
    return tuple(r for r in (2, 3, 4) if (2 * H) % r == 0 and r - 1 <= H)


def dape_v2_chain_forward(q, k, v, w1, b1, w2, b2, table=None, prepared=None, ring=None):
    """Forward of causal DAPE V2 attention, q, k, v [B, H, T, 64] bf16 on an sm_90 GPU; returns (o
    [B, H, T, 64] bf16, lse [B, H, T] fp32, natural log). prepared: gluon.prepare's operands for these
    weights, table and T (tables.cached), if the caller has them. ring: the K/V ring's slots, one of
    ring_sizes(H) (default 2: one tile in flight; 3 and 4 are for timing until measured)."""
    import torch

    B, H, T, dh = q.shape
    D, ks = w1.shape[0], w1.shape[-1]
    if dh != 64 or H > MAX_HEADS or D > CS or ks not in (1, 3) or q.dtype != torch.bfloat16:
        raise NotImplementedError(f"DAPE V2 forward chain: d 64, H <= {MAX_HEADS}, D <= {CS}, k in (1, 3), bf16 "
                                  f"only (got d {dh}, H {H}, D {D}, k {ks}, {q.dtype})")
    ring = 2 if ring is None else ring
    if ring not in ring_sizes(H):
        raise ValueError(f"DAPE V2 forward chain: a K/V ring of {ring} slots at H {H} (takes {ring_sizes(H)})")
    q, k, v = (_aligned(x) for x in (q, k, v))
    W1A, W2A, t1, k0, t2 = prepared if prepared is not None else prepare(w1, b1, w2, b2, table, T, H, q.device)
    o = torch.empty_like(q)
    lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    grid = ((T + BM - 1) // BM, B)
    kernel()[grid](q, k, v, W1A, W2A, t1, k0, t2, o, lse,
                   *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                   T, 1.0 / math.sqrt(dh), H=H, D=D, KS=ks, BM=BM, RING=ring, num_warps=NUM_WARPS)
    return o, lse


__all__ = ["BM", "BNW", "MAX_HEADS", "dape_v2_chain_forward", "kernel", "ring_sizes", "unsupported_reason"]
