"""DAPE V2 causal attention forward as chain.py's chain with its steps overlapped by warp
specialisation (Gluon, Hopper sm_90a, triton 3.6): the fused backend's forward-only DAPE V2 kernel where it
takes the shape (attention/backends/fused.py, `_gluon_forward`). The design, its shared-memory budget, the
measured time and the profile: notes/kernels.md, "Issue 45 step 5" and after.

A CTA owns BM = 16 query rows of one batch entry, all heads, and walks chain.py's 64-key windows. Its
12 warps are two partitions working on different windows at once:
 - conv (the default partition, 8 warps): the conv rows of window w (gluon.py's row-pair loop, one
   row per warpgroup), reading S from the window's buffer X_b [BM, 16 slots, 64 keys] and writing
   L = S + f over it (one fp16 rounding of the sum: S and f - g are fp16 already; window 0's keys
   below 2h keep f alone and S in fp32 aside, as _qk says);
 - heads (one 4-warp partition): the softmax and PV of window w - 1 and QK of window w + 1 for head
   groups t = 0, 1, 2 (heads 4 t .. 4 t + 3; warp i takes head 4 t + i). Every head tensor carries the
   group's four heads as a leading dimension and mma_v2 runs with warps [4, 1, 1], so each warp
   multiplies its own head's tiles and the code exists once, not once per warp (the instruction-cache
   argument in the notes). The query rows are on M: a row's maximum is a max over a thread's keys and
   two shuffles in its quad, P stays in registers as the A operand, and O, m, l sit in shared memory.
Hand-offs: X_b for window w (b = w % 2) is ready for the conv when sready[b] has the head partition's
one arrival (after a partition barrier: all four warps' S is stored), for the heads when lready[b]
has the conv's; each waits on phase (w // 2) & 1. emulate_chain_ws.ws_protocol replays this on window
names.

Limits as chain.py: d 64, H <= 12, D <= 32, k in (1, 3), bf16. H need not be a multiple of 4: the
last group's heads >= H read zero Q, K and V tiles and are never written out. Each warp streams its
head's K and V tiles through one tile buffer (no prefetch across groups: the first thing to tune).
"""

import math

from .chain import MAX_HEADS, unsupported_reason
from .gluon import BM, CS, NUM_WARPS, _GLUON_ERROR, _aligned, prepare

HEAD_WARPS = 4   # the head partition: one warpgroup, a head group of 4 heads at a time
HEAD_REGS = 168   # its registers a thread, and the conv partition's (12 warps x 168 is the register file)


if _GLUON_ERROR is None:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, mbarrier, mma_v2,
                                                                   warpgroup_mma)

    from .gluon import (_col_key, _lane_shift, _minus_k0, _next_row, _slot_key, _slot_run, _tapsum,
                        _thread_barrier, _to_columns, _to_rows, _unpack16)

    # Fp against bank conflicts (notes/kernels.md, "Issue 45 step 6"): the conv's stmatrix of f writes 8
    # slots (rows of 128 B) per 8x8 matrix, which unswizzled sit in the same 4 banks (8 wavefronts a
    # matrix, not 1). Its 16-byte chunks XOR the slot % 8; the L update's 8-byte reads of a row stay
    # whole and conflict-free. (The order has one entry less than the shape, as for the kernel's other
    # buffers: .index drops a dim.)
    FP_SWIZZLE = gl.constexpr(gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))

    @gluon.jit
    def _conv_input(xrows, i):
        """Conv1's B operand [16, 128] from rows i, i + 1 of X's row view xrows [2 BM, 16, 64]."""
        LX2: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [8, 1], [1, 0])          # [16, 64]
        x0 = xrows.index(i).load(LX2)
        x1 = xrows.index(i + 1).load(LX2)
        return gl.reshape(gl.permute(gl.join(x0, x1), (0, 2, 1)), [16, 128])

    @gluon.jit
    def _conv_rows_ws(xrows, r0, Fp, Xb, Zb, w1, w2, T1, K0, pp, cc, key0, pp2, cc2, q2, q0, ws, T,
                      D: gl.constexpr, KS: gl.constexpr, BM: gl.constexpr, WITH_K0: gl.constexpr):
        """gluon._conv_rows on a window's X: per row pair, conv1 -> t1, k0 -> LeakyReLU -> residual ->
        conv2 -> f - g (32 slots) into the pair scratch Fp, then L = S + f of slots 0..15 over X (window 0's
        keys < 2h: f alone, see _qk). xrows: both windows' X as rows [2 BM, 16, 64], this window's from
        row r0."""
        ACC_Y: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                        instr_shape=[16, 64, 16])
        LL: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [8, 1], [1, 0])   # [16, 64]
        Fp2 = Fp._reinterpret(gl.float16, [2, 32, 64], FP_SWIZZLE)   # row p, slot c (Fp's swizzle: phase c % 8)
        key = key0 + ws
        rows = q0 + pp
        dist = rows - key
        t1v = gl.load(T1 + (cc * (2 * T - 1) + T - 1 - key) + rows,
                      mask=(cc < D) & (dist < T) & (dist > -T), other=0.0)
        for ip in range(BM // 2):
            ne = q0 + 2 * ip + pp2 + 1 - ws
            e1 = gl.load(T1 + cc2 * (2 * T - 1) + T - 1 + ne + q2 * 0, mask=(cc2 < D) & (ne < T), other=0.0)
            e2 = gl.load(T1 + cc2 * (2 * T - 1) + T + ne + q2 * 0, mask=(cc2 < D) & (ne + 1 < T), other=0.0)
            Xb.store(_conv_input(xrows, r0 + 2 * ip))
            _thread_barrier()   # the partition's 256 threads (previous pair's L loads and stores included)
            fence_async_shared()
            y = _tapsum(warpgroup_mma(w1, Xb, gl.zeros([128, 128], gl.float32, ACC_Y), use_acc=False), KS)
            y += t1v
            if WITH_K0:
                y = _minus_k0(y, K0, q0 + 2 * ip + pp2, cc2, q2, D, T)
            z = gl.maximum(y, 0.01 * y)
            z = gl.where((key >= 0) & (key < T), z, 0.0) - gl.maximum(t1v, 0.01 * t1v)
            t1v = _next_row(_next_row(t1v, e1), e2)
            Zb.store(_to_columns(z).to(gl.float16))
            _thread_barrier()
            fence_async_shared()
            f = _tapsum(warpgroup_mma(w2, Zb, gl.zeros([128, 128], gl.float32, ACC_Y), use_acc=False), KS)
            Fp.store(_to_rows(f).to(gl.float16))
            _thread_barrier()
            for p in gl.static_range(2):
                xr = xrows.index(r0 + 2 * ip + p)
                fr = Fp2.index(p).slice(0, 16, dim=0).load(LL).to(gl.float32)
                if WITH_K0:   # window 0: keys 0 .. 2h - 1 keep f alone (|f - g| there is table-sized)
                    edge = ws + _col_key(gl.arange(0, 64, gl.SliceLayout(0, LL))) < 2 * (KS // 2)
                    xr.store(gl.where(edge[None, :], fr, xr.load(LL).to(gl.float32) + fr).to(gl.float16))
                else:
                    xr.store((xr.load(LL).to(gl.float32) + fr).to(gl.float16))

    @gluon.jit
    def _conv_part(X, Xrows, Fp, Xb, Zb, w1, w2, T1, K0, sready, lready, q0, T, n_win,
                   D: gl.constexpr, KS: gl.constexpr, BM: gl.constexpr):
        """The conv partition: window w waits for its S (sready), leaves L (lready)."""
        HALF: gl.constexpr = KS // 2
        STEP: gl.constexpr = 64 - 4 * HALF
        ACC_Y: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                        instr_shape=[16, 64, 16])
        y0 = _tapsum(gl.zeros([128, 128], gl.float32, ACC_Y), KS)
        pp, cc, key0 = _slot_key(y0)
        pp2, cc2, q2 = _slot_run(_lane_shift(_unpack16(y0)[15], -1))
        for w in range(n_win):
            ws = w * STEP - 2 * HALF
            mbarrier.wait(sready.index(w % 2), (w // 2) & 1)
            if HALF > 0:
                if w == 0:
                    _conv_rows_ws(Xrows, (w % 2) * BM, Fp, Xb, Zb, w1, w2, T1, K0, pp, cc, key0, pp2, cc2, q2, q0, ws, T, D, KS, BM, True)
                else:
                    _conv_rows_ws(Xrows, (w % 2) * BM, Fp, Xb, Zb, w1, w2, T1, K0, pp, cc, key0, pp2, cc2, q2, q0, ws, T, D, KS, BM, False)
            else:
                _conv_rows_ws(Xrows, (w % 2) * BM, Fp, Xb, Zb, w1, w2, T1, K0, pp, cc, key0, pp2, cc2, q2, q0, ws, T, D, KS, BM, False)
            _thread_barrier()   # every thread's L is stored before the one elected arrive
            mbarrier.arrive(lready.index(w % 2))

    HW = gl.constexpr(HEAD_WARPS)

    @gluon.constexpr_function
    def _head_mma():
        """mma_v2 with the head as a batch dimension, one warp per head: [4, 16, n] accumulators."""
        return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[HW, 1, 1], instr_shape=[1, 16, 8])

    @gluon.constexpr_function
    def _groups(H):
        """Head groups (4 heads, one a warp): the head buffers' first dimension."""
        return (H + HEAD_WARPS - 1) // HEAD_WARPS

    @gluon.jit
    def _to_blocks(x):
        """O [heads, rows, 16 nb] -> [heads, nb, rows, 16], its order in shared memory (Os): blocks of 16
        columns (renames in registers). Each 8-byte access of the mma_v2 accumulator's layout reads 8
        rows x 32 bytes; in rows of 256 B those sat in the same 8 banks (8 wavefronts, 2 the least), in
        rows of 64 B in two groups of 8 (4 wavefronts). Blocks of 8 columns (2 wavefronts) spilled a
        loop-invariant in the head partition's window loop (triton 3.6; notes/kernels.md, step 6)."""
        return gl.permute(gl.reshape(x, [x.shape[0], x.shape[1], x.shape[2] // 16, 16]), (0, 2, 1, 3))

    @gluon.jit
    def _load_blocks(buf, like):
        """buf [heads, nb, rows, 16] (Os) as a [heads, rows, 16 nb] tensor in the layout of `like`."""
        x = buf.load(_to_blocks(like).type.layout)
        x = gl.reshape(gl.permute(x, (0, 2, 1, 3)), [like.shape[0], like.shape[1], like.shape[2]])
        return gl.convert_layout(x, like.type.layout, assert_trivial=True)

    @gluon.jit
    def _load_tiles(tiles, base, sh, st, h0, ws, T, H: gl.constexpr):
        """cp.async the [64, 64] K or V tiles of heads h0 .. h0 + 3 of the window at ws (warp i copies
        head h0 + i's into tiles[i]; keys in the permuted order, zero outside [0, T) and for heads >= H),
        wait for them; a partition barrier before any lane reads."""
        L1: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 4, 8], [HW, 1, 1], [2, 1, 0])
        i = gl.arange(0, HW, gl.SliceLayout(1, gl.SliceLayout(2, L1)))   # the warp
        keys = ws + _col_key(gl.arange(0, 64, gl.SliceLayout(0, gl.SliceLayout(2, L1))))
        d = gl.arange(0, 64, gl.SliceLayout(0, gl.SliceLayout(1, L1)))
        _thread_barrier()   # the tiles' last reader (ldmatrix by any lane) is done
        # the group's head in the scalar base: the per-thread offsets are then the same for every group
        async_copy.async_copy_global_to_shared(
            tiles, (base + h0 * sh) + (i[:, None, None] * sh + keys[None, :, None] * st + d[None, None, :]),
            mask=(h0 + i < H)[:, None, None] & ((keys >= 0) & (keys < T))[None, :, None])
        async_copy.commit_group()
        async_copy.wait_group(0)
        _thread_barrier()

    @gluon.jit
    def _qk(Qs, X, Se, tiles, Kb, skh, skt, t: gl.constexpr, w, q0, T, scale, H: gl.constexpr, KS: gl.constexpr,
            BM: gl.constexpr, EDGE: gl.constexpr):
        """S of heads 4 t .. 4 t + 3 (warp i: head 4 t + i) of window w = scale Q_h K_h^T (mma_v2, rows on
        M), tril, fp16 into X_(w % 2) slots 4 t .. 4 t + 3 (heads >= H: zeros). With EDGE (window 0) also
        S of keys 0 .. 2h - 1 into Se: there |f - g| takes the size of the bias (the conv taps reach keys
        < 0, where the hidden map is -leaky(t1)), up to ~2e3 for ALiBi at T 1000, and an fp16 L = S + f
        would lose S's bits (0.5 logit); the conv writes f alone there, the softmax adds this S in fp32,
        as chain.py sums fp16 S and fp16 f."""
        HALF: gl.constexpr = KS // 2
        STEP: gl.constexpr = 64 - 4 * HALF
        MMA: gl.constexpr = _head_mma()
        ws = w * STEP - 2 * HALF
        _load_tiles(tiles, Kb, skh, skt, HW * t, ws, T, H)
        qa = Qs.index(t).load(gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))
        rows = q0 + gl.arange(0, BM, gl.SliceLayout(0, gl.SliceLayout(2, MMA)))
        xs = X.index(w % 2).slice(HW * t, HW, dim=1).permute((1, 0, 2))   # [heads, rows, keys]
        for half in gl.static_range(2):   # 32 key columns at a time: half of K's B operand live
            kb = tiles.slice(32 * half, 32, dim=1).permute((0, 2, 1)).load(
                gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2))
            s = mma_v2(qa, kb, gl.zeros([HW, BM, 32], gl.float32, MMA))
            keys = ws + _col_key(32 * half + gl.arange(0, 32, gl.SliceLayout(0, gl.SliceLayout(1, MMA))))
            tril = (keys[None, None, :] <= rows[None, :, None]) & ((keys >= 0) & (keys < T))[None, None, :]
            s = gl.where(tril, s * scale, 0.0).to(gl.float16)
            if EDGE and half == 0:   # keys 0 .. 2h - 1 of window 0 sit at offsets 2h .. 4h - 1: columns 8, 9
                for e in gl.static_range(2 * HALF):
                    s_e = gl.sum(gl.where(keys[None, None, :] == e, s.to(gl.float32), 0.0), axis=2)
                    Se.index(e * _groups(H) + t).store(s_e)
            xs.slice(32 * half, 32, dim=2).store(s)

    @gluon.jit
    def _softmax_pv(X, Se, Os, Ms, Ls, tiles, Vb, svh, svt, T2, t: gl.constexpr, w, q0, T, H: gl.constexpr,
                    KS: gl.constexpr, BM: gl.constexpr):
        """Logits L_h + (t2 + g)[h, i - j] of window w on its outputs and the causal triangle for heads
        4 t .. 4 t + 3 (warp i: head 4 t + i; heads >= H fully masked), online softmax (a row's 64 keys:
        16 per lane of a quad), O_h += P V_h (mma_v2)."""
        HALF: gl.constexpr = KS // 2
        STEP: gl.constexpr = 64 - 4 * HALF
        LOG2E: gl.constexpr = 1.4426950408889634
        MMA: gl.constexpr = _head_mma()
        R2: gl.constexpr = gl.SliceLayout(2, MMA)   # [heads, rows]
        ws = w * STEP - 2 * HALF
        hh = HW * t + gl.arange(0, HW, gl.SliceLayout(1, R2))
        rows = q0 + gl.arange(0, BM, gl.SliceLayout(0, R2))
        off = _col_key(gl.arange(0, 64, gl.SliceLayout(0, gl.SliceLayout(1, MMA))))
        keys = ws + off
        kin = (keys >= 0) & (keys < T) & (off >= 2 * HALF) & (off < 64 - 2 * HALF)
        valid = ((keys[None, None, :] <= rows[None, :, None]) & kin[None, None, :]
                 & (rows < T)[None, :, None] & (hh < H)[:, None, None])
        t2 = gl.load(T2 + hh[:, None, None] * (2 * T - 1) + (rows[None, :, None] - keys[None, None, :] + T - 1),
                     mask=valid, other=0.0)
        lf = X.index(w % 2).slice(HW * t, HW, dim=1).permute((1, 0, 2)).load(MMA).to(gl.float32)
        for e in gl.static_range(2 * HALF):   # keys 0 .. 2h - 1 (window 0): L holds f alone, S is in Se (_qk)
            lf += gl.where(keys[None, None, :] == e, Se.index(e * _groups(H) + t).load(R2)[:, :, None], 0.0)
        lg = gl.where(valid, lf + t2, float("-inf"))
        ms = Ms.index(t)
        ls = Ls.index(t)
        m_old = ms.load(R2)
        m_new = gl.maximum(m_old, gl.max(lg, axis=2))
        alpha = gl.exp2((m_old - m_new) * LOG2E)
        p = gl.exp2((lg - m_new[:, :, None]) * LOG2E)
        ls.store(ls.load(R2) * alpha + gl.sum(p, axis=2))
        ms.store(m_new)
        _load_tiles(tiles, Vb, svh, svt, HW * t, ws, T, H)
        pa = gl.convert_layout(p.to(gl.bfloat16), gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))
        for half in gl.static_range(2):   # O's halves in turn: half of V's B operand live at a time
            vb = tiles.slice(32 * half, 32, dim=2).load(gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2))
            oh = Os.index(2 * t + half)
            acc = _load_blocks(oh, gl.zeros([HW, BM, 32], gl.float32, MMA))
            oh.store(_to_blocks(mma_v2(pa, vb, acc * alpha[:, :, None])))

    @gluon.jit
    def _head_part(Qs, X, Se, Os, Ms, Ls, tiles, sready, lready, Kb, Vb, T2, O, LSE,
                   skh, skt, svh, svt, soh, sot, b, q0, T, scale, n_win,
                   H: gl.constexpr, KS: gl.constexpr, BM: gl.constexpr):
        """The head partition (4 warps, warp i: heads i, i + 4, i + 8, in head groups t = 0, 1, 2): QK
        of windows 0 and 1, then per window w the softmax and PV of w and QK of w + 2 into the buffer w
        just freed; O / l and LSE at the end. Every tensor is [4 heads, ...]: one copy of the code."""
        MMA: gl.constexpr = _head_mma()
        R2: gl.constexpr = gl.SliceLayout(2, MMA)
        NG: gl.constexpr = _groups(H)
        for t in gl.static_range(NG):
            for half in gl.static_range(2):
                Os.index(2 * t + half).store(_to_blocks(gl.zeros([HW, BM, 32], gl.float32, MMA)))
            Ms.index(t).store(gl.full([HW, BM], -1.0e30, gl.float32, R2))
            Ls.index(t).store(gl.zeros([HW, BM], gl.float32, R2))
        for w in gl.static_range(2):
            if w < n_win:
                for t in gl.static_range(NG):
                    _qk(Qs, X, Se, tiles, Kb, skh, skt, t, w, q0, T, scale, H, KS, BM, w == 0)
                _thread_barrier()   # all four warps' S is stored before the one elected arrive
                mbarrier.arrive(sready.index(w))
        for w in range(n_win):
            mbarrier.wait(lready.index(w % 2), (w // 2) & 1)
            for t in gl.static_range(NG):
                _softmax_pv(X, Se, Os, Ms, Ls, tiles, Vb, svh, svt, T2, t, w, q0, T, H, KS, BM)
            if w + 2 < n_win:
                for t in gl.static_range(NG):
                    _qk(Qs, X, Se, tiles, Kb, skh, skt, t, w + 2, q0, T, scale, H, KS, BM, False)
                _thread_barrier()
                mbarrier.arrive(sready.index(w % 2))
        rows = q0 + gl.arange(0, BM, gl.SliceLayout(0, R2))
        d = gl.arange(0, 32, gl.SliceLayout(0, gl.SliceLayout(1, MMA)))
        for t in gl.static_range(NG):
            hh = HW * t + gl.arange(0, HW, gl.SliceLayout(1, R2))
            ok = (hh < H)[:, None] & (rows < T)[None, :]
            l = gl.maximum(Ls.index(t).load(R2), 1e-30)
            for half in gl.static_range(2):
                o = _load_blocks(Os.index(2 * t + half), gl.zeros([HW, BM, 32], gl.float32, MMA)) / l[:, :, None]
                gl.store(O + hh[:, None, None] * soh + rows[None, :, None] * sot + (32 * half + d)[None, None, :],
                         o.to(gl.bfloat16), mask=ok[:, :, None])
            gl.store(LSE + (b * H + hh[:, None]) * T + rows[None, :], Ms.index(t).load(R2) + gl.log(l),
                     mask=ok)

    @gluon.jit
    def _dape_v2_chain_ws(Q, K, V, W1A, W2A, T1, K0, T2, O, LSE,
                          sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
                          T, scale,
                          H: gl.constexpr, D: gl.constexpr, KS: gl.constexpr, BM: gl.constexpr,
                          HEAD_REGS: gl.constexpr, num_warps: gl.constexpr):
        HALF: gl.constexpr = KS // 2
        STEP: gl.constexpr = 64 - 4 * HALF
        pid_m = gl.num_programs(0) - 1 - gl.program_id(0)  # late (heavy) query blocks first
        b = gl.program_id(1)
        q0 = pid_m * BM
        n_win = (gl.minimum(q0 + BM, T) - 1 + STEP) // STEP   # chain.py's windows from -2h, step STEP

        LD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
        LF3: gl.constexpr = gl.BlockedLayout([1, 1, 2], [1, 1, 32], [8, 1, 1], [2, 1, 0])
        PLAIN2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        PLAIN3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
        PLAIN4: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0])
        BAR: gl.constexpr = mbarrier.MBarrierLayout()
        NG: gl.constexpr = _groups(H)   # head buffers are [NG, 4, ...]: ptxas's layouts want powers of 2 after .index
        QL: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [2, 1, 0])   # ldmatrix without bank conflicts
        Qs = gl.allocate_shared_memory(gl.bfloat16, [NG, HW, BM, 64], QL)
        X = gl.allocate_shared_memory(gl.float16, [2, BM, 16, 64], PLAIN3)   # per window: S in, L = S + f out
        Xrows = X._reinterpret(gl.float16, [2 * BM, 16, 64], PLAIN2)          # the same bytes, a row per .index
        Fp = gl.allocate_shared_memory(gl.float16, [64, 64], FP_SWIZZLE)     # a row pair's f (32 slots)
        Xb = gl.allocate_shared_memory(gl.float16, [16, 128], gl.NVMMASharedLayout.get_default_for([16, 128], gl.float16))
        Zb = gl.allocate_shared_memory(gl.float16, [32, 128], gl.NVMMASharedLayout.get_default_for([32, 128], gl.float16))
        Os = gl.allocate_shared_memory(gl.float32, [2 * NG, HW, 2, BM, 16], PLAIN4)   # O: group, half, _to_blocks
        Ms = gl.allocate_shared_memory(gl.float32, [NG, HW, BM], PLAIN2)
        Ls = gl.allocate_shared_memory(gl.float32, [NG, HW, BM], PLAIN2)
        Se = gl.allocate_shared_memory(gl.float32, [2 * NG, HW, BM], PLAIN2)   # window 0's S of keys 0, 1 (_qk)
        # one K / V tile per head warp; the swizzle stays inside 32-column halves (PV slices V there): with
        # (8, 1, 8) ptxas spilled 3 values in the head loop; ldmatrix on it is 2-way bank-conflicted
        KV: gl.constexpr = gl.SwizzledSharedLayout(8, 2, 4, [2, 1, 0])
        tiles = gl.allocate_shared_memory(gl.bfloat16, [HW, 64, 64], KV)
        sready = gl.allocate_shared_memory(gl.int64, [2, 1], BAR)
        lready = gl.allocate_shared_memory(gl.int64, [2, 1], BAR)
        for i in gl.static_range(2):
            mbarrier.init(sready.index(i), count=1)   # the head partition's one (elected) arrival
            mbarrier.init(lready.index(i), count=1)   # the conv partition's

        r128 = gl.arange(0, 128, gl.SliceLayout(1, LD))
        w1 = gl.allocate_shared_memory(gl.float16, [128, 16], gl.NVMMASharedLayout.get_default_for([128, 16], gl.float16))
        w1.store(gl.load(W1A + r128[:, None] * 16 + gl.arange(0, 16, gl.SliceLayout(0, LD))[None, :]))
        w2 = gl.allocate_shared_memory(gl.float16, [128, 32], gl.NVMMASharedLayout.get_default_for([128, 32], gl.float16))
        w2.store(gl.load(W2A + r128[:, None] * 32 + gl.arange(0, 32, gl.SliceLayout(0, LD))[None, :]))
        for i in gl.static_range(2):   # conv1's input slots H..15 stay zero (W1A is zero there too)
            for h in gl.static_range(H, 16):
                X.index(i).slice(h, 1, dim=1).store(gl.zeros([BM, 1, 64], gl.float16, LF3))
        LQ: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 4, 8], [1, 8, 1], [2, 1, 0])   # [1, BM, 64]
        q_rows = q0 + gl.arange(0, BM, gl.SliceLayout(0, gl.SliceLayout(2, LQ)))
        q_d = gl.arange(0, 64, gl.SliceLayout(0, gl.SliceLayout(1, LQ)))
        q_off = b * sqb + q_rows[None, :, None] * sqt + q_d[None, None, :]
        for h in gl.static_range(HW * NG):   # heads H .. 4 NG - 1: zeros (their S is zero, their outputs masked)
            qh = gl.load(Q + h * sqh + q_off, mask=(q_rows < T)[None, :, None] & (h < H), other=0.0)
            Qs.index(h // HW).slice(h % HW, 1, dim=0).store(qh)
        fence_async_shared()
        gl.warp_specialize([
            (_conv_part, (X, Xrows, Fp, Xb, Zb, w1, w2, T1, K0, sready, lready, q0, T, n_win, D, KS, BM)),
            (_head_part, (Qs, X, Se, Os, Ms, Ls, tiles, sready, lready, K + b * skb, V + b * svb, T2, O + b * sob,
                          LSE, skh, skt, svh, svt, soh, sot, b, q0, T, scale, n_win, H, KS, BM)),
        ], [HW], [HEAD_REGS])


def kernel():
    """The Gluon kernel (needs triton with a 3.6-compatible Gluon)."""
    if _GLUON_ERROR is not None:
        raise RuntimeError(f"triton Gluon (Hopper) unavailable: {_GLUON_ERROR!r}")
    return _dape_v2_chain_ws


def dape_v2_chain_ws_forward(q, k, v, w1, b1, w2, b2, table=None, prepared=None):
    """Forward of causal DAPE V2 attention, q, k, v [B, H, T, 64] bf16 on an sm_90 GPU, through the
    warp-specialised chain; returns (o [B, H, T, 64] bf16, lse [B, H, T] fp32, natural log).
    prepared: gluon.prepare's operands for these weights, table and T (tables.cached), if the caller has them."""
    import torch

    B, H, T, dh = q.shape
    D, ks = w1.shape[0], w1.shape[-1]
    if dh != 64 or H > MAX_HEADS or D > CS or ks not in (1, 3) or q.dtype != torch.bfloat16:
        raise NotImplementedError(f"DAPE V2 warp-specialised chain: d 64, H <= {MAX_HEADS}, D <= {CS}, k in (1, 3), "
                                  f"bf16 only (got d {dh}, H {H}, D {D}, k {ks}, {q.dtype})")
    q, k, v = (_aligned(x) for x in (q, k, v))
    W1A, W2A, t1, k0, t2 = prepared if prepared is not None else prepare(w1, b1, w2, b2, table, T, H, q.device)
    o = torch.empty_like(q)
    lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    grid = ((T + BM - 1) // BM, B)
    kernel()[grid](q, k, v, W1A, W2A, t1, k0, t2, o, lse,
                   *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                   T, 1.0 / math.sqrt(dh), H=H, D=D, KS=ks, BM=BM, HEAD_REGS=HEAD_REGS, num_warps=NUM_WARPS)
    return o, lse


__all__ = ["BM", "HEAD_REGS", "HEAD_WARPS", "dape_v2_chain_ws_forward", "kernel", "unsupported_reason"]
