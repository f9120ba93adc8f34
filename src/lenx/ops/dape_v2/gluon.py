"""DAPE V2 causal attention forward in Gluon for Hopper (sm_90a), written against triton 3.6's Gluon
API (notes/gluon.md lists what 3.6 accepts and refuses). Two warpgroups per CTA running the same code
on different query rows (8 warps, no warp specialization), synchronous wgmma; K and V stream in by
cp.async one head ahead (GPU runs, profile and per-stage costs: notes/gluon.md, notes/kernels.md).

    out = softmax_causal(S + Bias + f(tril([S; Bias]))) V,   S = Q K^T / sqrt(d)
    f = conv2(leaky_relu(conv1(.), 0.01)), both convs (1, k) along keys with zero padding k // 2

with rewrite A (reference.dape_v2_tables): conv1 over the bias channels is the table t1 [D, 2T - 1]
(b1 folded in, the padding left of key 0 taken back out by k0), Bias + b2 is the table t2.

Schedule. A CTA owns BM = 16 query rows of one batch entry, all heads. It walks the keys in windows of
64 keys starting at ws = -2h, stepping 64 - 4h (h = k // 2), like the Triton kernel: a window's outputs
are its keys [ws + 2h, ws + 64 - 2h); its 2h keys of halo on each side are recomputed by the
neighbouring windows (no carry between windows). Per window:

 0. (once) Q of all heads into shared memory. K_h (step 1) and K_h, V_h (step 3) tiles come through a
    2-slot ring of cp.async copies, each issued while the previous head is being processed.
 1. per head: S_h^T = K_h Q_h^T (wgmma, M = 64 keys, N = BM: warpgroup g takes query rows 8 g .. 8 g + 7,
    the accumulators' warps are [4, 2]), scaled, tril (0 above the diagonal and outside [0, T)), fp16,
    into XF [BM, 32 slots, 64 keys] (slots 0..15: the conv1 input X_i of row i).
 2. per pair of query rows i, i + 1 (a run-time loop; warpgroup p takes row i + p: the conv accumulators
    are [128, 128], column 64 p + n): Y = W1A @ X_i (wgmma: A = conv1 weights [128, 16], B = X_i
    [16 heads, 64 keys]; both rows' X side by side, [16, 128]). Row 64 a + 16 w + 8 r + l of W1A holds tap 2 a + r of channel 8 w + l, so
    each thread holds all taps of one channel (rows in-thread). The window's K rows are loaded in the
    permuted order  column n = 8 m + 2 q + b  <->  key ws + 16 q + 2 m + b,  so the accumulator gives
    lane q of each quad 16 consecutive keys. The tap sum y[j] = sum_t Y_t[j + t - h] is then register
    renames (reshape / permute / split / join) plus one lane shuffle per tap that crosses a 16-key run
    (2 SHFL per channel for k = 3). + t1[c, i - j] (the next pair's is this one shifted two keys: renames,
    two shuffles and two loads per run) - k0 at keys < h (first window only), LeakyReLU, zero outside [0, T),
    minus leaky(t1[c, i - j]) at every key (the residual hidden map, see below), into shared memory as
    conv2's B operand; F = W2A @ Z the same way (rows: taps x head slots), tap sum, f - g over XF[i]
    (fp16, 32 head slots).
 3. per head: S_h^T again (recomputed rather than stored: shared memory is the limit), logits =
    S + (t2 + g)[h, i - j] (read a head ahead) + (f - g), masked to the window's outputs and the causal
    triangle, online softmax (the keys are spread over a warpgroup's 4 warps: the tile maxima are exchanged
    through shared memory, the row sums are kept per warp and added in the epilogue), P^T in bf16 to shared
    memory, O_h^T += V_h^T P^T (wgmma, M = d). O^T of all heads lives in shared memory (fp32).

Limits of this version: k in {1, 3} (4 tap rows per thread; k = 5, 7 need a second accumulator),
D <= 32, H <= 16, d = 64, bf16 q/k/v. The conv path is fp16 (the scores are rounded to fp16 as conv1's
input, as in KERNEL_PLAN.md section 2); the logits use fp32 scores and an fp16 residual f - g.

Residual hidden map. With a large bias table (ALiBi at T 1000: |t1| ~ 600) the hidden map z and f are
in the hundreds, and fp16 z and f cost logit errors of ~0.1 (rel err 0.03 on the GPU). So conv2 gets
z - leaky(t1[c, i - u]) (at every key u of the window, the padding keys included), which is bounded by
conv1 of the scores; its conv2 is f - g with g[h, i - j] = conv2 of leaky(t1) (reference.residual_table:
a per-distance table, exact because the subtracted map depends on i - u only), and the host folds g
into t2 (fp32).

torch is imported lazily and triton's Gluon under a guard (the kernels are defined only where its
names import; defining them compiles nothing), so this module imports anywhere;
scripts/tune/gluon_compile.py compiles the kernel without torch.
"""

import math

BM = 16          # query rows per CTA
BNW = 64         # keys per window
CS = 32          # channel / head slots of a row's [128, 64] conv accumulator (4 warps x 8 lane groups)
HP = 16          # heads padded to conv1's K (one fp16 wgmma K step)
NUM_WARPS = 8    # two warpgroups (at 255 registers a thread, the whole register file)


def tap_row(t: int, c: int) -> int:
    """Row of the [128, .] conv weight matrices holding tap t (< 4) of channel / head slot c (< 32):
    64 a + 16 w + 8 r + l for t = 2 a + r and c = 8 w + l. In the wgmma accumulator the bits a, r are
    a thread's own registers, w its warp and l its lane group, so one thread holds all taps of c."""
    return 64 * (t >> 1) + 8 * (t & 1) + 16 * (c >> 3) + (c & 7)


def key_of_column(n: int) -> int:
    """The window key offset held by column n of the permuted key order: n = 8 m + 2 q + b holds key
    16 q + 2 m + b (lane q of an accumulator quad then holds keys 16 q .. 16 q + 15)."""
    return 16 * ((n >> 1) & 3) + 2 * (n >> 3) + (n & 1)


def conv_weights(w1, w2, H: int, device):
    """W1A [128, 16] and W2A [128, 32] (fp16) from w1 [D, C, 1, k] (its first H input channels are the
    scores) and w2 [H, D, 1, k]. The row indices are built on the device (tap_row's arithmetic): a host
    tensor copied in would make every call wait for the GPU."""
    import torch

    D, ks = w1.shape[0], w1.shape[-1]
    W1A = torch.zeros(128, HP, dtype=torch.float32, device=device)
    W2A = torch.zeros(128, CS, dtype=torch.float32, device=device)
    t = torch.arange(ks, device=device)[:, None]
    c = torch.arange(max(D, H), device=device)[None, :]
    rows = 64 * (t >> 1) + 8 * (t & 1) + 16 * (c >> 3) + (c & 7)   # tap_row(t, c)
    for j in range(ks):
        W1A[rows[j, :D], :H] = w1[:, :H, 0, j].float()
        W2A[rows[j, :H], :D] = w2[:, :, 0, j].float()
    return W1A.half().contiguous(), W2A.half().contiguous()


try:  # Gluon's API moves between triton versions: a missing name leaves the module importable
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import async_copy, fence_async_shared, warpgroup_mma
    _thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # 3.6 name; 3.9: gl.barrier
    _GLUON_ERROR = None
except Exception as e:  # no triton, or a Gluon without these names
    _GLUON_ERROR = e


def _kernels():
    """The Gluon kernels (needs triton with a 3.6-compatible Gluon)."""
    if _GLUON_ERROR is not None:
        raise RuntimeError(f"triton Gluon (Hopper) unavailable: {_GLUON_ERROR!r}")
    return {"fwd": _dape_v2_fwd}


if _GLUON_ERROR is None:

    @gluon.jit
    def _halves(x):
        """Split the last axis (2 s) of x [P, C, Q, 2 s] into even and odd entries (renames: it lives
        in registers)."""
        s: gl.constexpr = x.shape[3] // 2
        return gl.split(gl.reshape(x, [x.shape[0], x.shape[1], x.shape[2], s, 2]))

    @gluon.jit
    def _unpack16(x):
        """[P, C, Q, 16] -> 16-tuple of [P, C, Q], entry u = x[..., u]."""
        e, o = _halves(x)
        e0, e1 = _halves(e)
        o0, o1 = _halves(o)
        e00, e01 = _halves(e0)
        e10, e11 = _halves(e1)
        o00, o01 = _halves(o0)
        o10, o11 = _halves(o1)
        a0, a8 = gl.split(e00)
        a4, a12 = gl.split(e01)
        a2, a10 = gl.split(e10)
        a6, a14 = gl.split(e11)
        a1, a9 = gl.split(o00)
        a5, a13 = gl.split(o01)
        a3, a11 = gl.split(o10)
        a7, a15 = gl.split(o11)
        return (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15)

    @gluon.jit
    def _j(a, b):
        x = gl.join(a, b)
        return gl.reshape(x, [x.shape[0], x.shape[1], x.shape[2], x.shape[3] * 2])

    @gluon.jit
    def _pack16(p):
        """Inverse of _unpack16."""
        e00 = gl.join(p[0], p[8])
        e01 = gl.join(p[4], p[12])
        e10 = gl.join(p[2], p[10])
        e11 = gl.join(p[6], p[14])
        o00 = gl.join(p[1], p[9])
        o01 = gl.join(p[5], p[13])
        o10 = gl.join(p[3], p[11])
        o11 = gl.join(p[7], p[15])
        return _j(_j(_j(e00, e01), _j(e10, e11)), _j(_j(o00, o01), _j(o10, o11)))

    @gluon.jit
    def _lane_shift(v, s: gl.constexpr):
        """v [P, C, 4], the 4-axis on the lanes of a quad: out[..., q] = v[..., (q + s) % 4] (one SHFL)."""
        L: gl.constexpr = v.type.layout
        q = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(1, L)))[None, None, :] + gl.zeros(v.shape, gl.int32, L)
        return gl.gather(v, (q + s + 4) % 4, 2)

    @gluon.jit
    def _taps(y):
        """[128, 128] conv accumulator of a row pair (column 64 p + n: row p of the pair, n the permuted
        key column) -> 4 tap tiles [2 p, 32 slots, 4 q, 16 u] (key 16 q + u): renames."""
        y = gl.reshape(y, [2, 4, 2, 8, 2, 8, 4, 2])          # a, w, r, l, p, m, q, b
        y = gl.permute(y, [4, 1, 3, 6, 5, 7, 0, 2])          # p, w, l, q, m, b, a, r
        y = gl.reshape(y, [2, 32, 4, 16, 2, 2])
        ya, yb = gl.split(y)
        t0, t2 = gl.split(ya)
        t1, t3 = gl.split(yb)
        return t0, t1, t2, t3

    @gluon.jit
    def _tapsum(y, KS: gl.constexpr):
        """out[p, c, 16 q + u] = sum_t Y_t[p, c, 16 q + u + t - k // 2] for the accumulator y; the keys a
        run's neighbour lane holds come by one shuffle each; the window's two outer keys are garbage
        (halo). Returns [2, 32, 4, 16]."""
        t0, t1, t2, t3 = _taps(y)
        if KS == 1:
            out = t0
        else:
            a = _unpack16(t0)
            b = _unpack16(t1)
            c = _unpack16(t2)
            le = _lane_shift(a[15], -1)
            re = _lane_shift(c[0], 1)
            out = _pack16((le + b[0] + c[1],
                           a[0] + b[1] + c[2], a[1] + b[2] + c[3], a[2] + b[3] + c[4], a[3] + b[4] + c[5],
                           a[4] + b[5] + c[6], a[5] + b[6] + c[7], a[6] + b[7] + c[8], a[7] + b[8] + c[9],
                           a[8] + b[9] + c[10], a[9] + b[10] + c[11], a[10] + b[11] + c[12],
                           a[11] + b[12] + c[13], a[12] + b[13] + c[14], a[13] + b[14] + c[15],
                           a[14] + b[15] + re))
        return out

    @gluon.jit
    def _next_row(x, edge):
        """x [2, 32, 4 q, 16 u] of a per-distance table at rows i (key 16 q + u) -> the same at rows
        i + 1, which is x one key to the right: renames, one shuffle for each run's first key, and
        `edge` [2, 32, 4] (the table at the window's first key, read by the caller) for lane 0."""
        a = _unpack16(x)
        le = _lane_shift(a[15], -1)
        _, _, q = _slot_run(le)
        le = gl.where(q == 0, edge, le)
        out = _pack16((le, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12],
                       a[13], a[14]))
        return gl.convert_layout(out, x.type.layout)

    @gluon.jit
    def _to_columns(x):
        """[2 p, 32, 4 q, 16 u] -> [32, 128]: column 64 p + n in the permuted order n = 8 m + 2 q + b
        (u = 2 m + b), conv2's B operand for the row pair."""
        x = gl.reshape(x, [2, 32, 4, 8, 2])
        return gl.reshape(gl.permute(x, [1, 0, 3, 2, 4]), [32, 128])

    @gluon.jit
    def _to_rows(x):
        """[2 p, 32, 4 q, 16 u] -> [64, 64]: row 32 p + c (XF's two rows of the pair), permuted column n."""
        x = gl.reshape(x, [2, 32, 4, 8, 2])
        return gl.reshape(gl.permute(x, [0, 1, 3, 2, 4]), [64, 64])

    @gluon.jit
    def _slot_key(y):
        """Index tensors for a [2, 32, 4, 16] tile in y's layout: the row of the pair p [2, 1, 1, 1],
        the slot c [1, 32, 1, 1] and the window key offset 16 q + u [1, 1, 4, 16]."""
        L4: gl.constexpr = y.type.layout
        pp = gl.arange(0, 2, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, L4))))[:, None, None, None]
        cc = gl.arange(0, 32, gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, L4))))[None, :, None, None]
        qq = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, L4))))[None, None, :, None]
        uu = gl.arange(0, 16, gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L4))))[None, None, None, :]
        return pp, cc, 16 * qq + uu

    @gluon.jit
    def _slot_run(v):
        """Index tensors for a [2, 32, 4] tile in v's layout (one value per 16-key run): p, slot, run."""
        L: gl.constexpr = v.type.layout
        return (gl.arange(0, 2, gl.SliceLayout(1, gl.SliceLayout(2, L)))[:, None, None],
                gl.arange(0, 32, gl.SliceLayout(0, gl.SliceLayout(2, L)))[None, :, None],
                gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(1, L)))[None, None, :])

    @gluon.jit
    def _warp_sums(x):
        """[64, BM] in the S^T accumulator layout (rows 16 w + ..: warp w holds 16 of the keys) -> [4, BM]:
        the sums over each warp's keys (shuffles within the warp, nothing across warps)."""
        return gl.sum(gl.reshape(x, [4, 16, x.shape[1]]), axis=1)

    @gluon.jit
    def _warp_max(x):
        """Like _warp_sums, the maxima over each warp's keys."""
        return gl.max(gl.reshape(x, [4, 16, x.shape[1]]), axis=1)

    @gluon.jit
    def _load_T(buf, like):
        """buf [BM, 1, 64] (a head's f in XF) as a [64, BM] tensor in like's layout, read straight in it."""
        d = gl.reshape(gl.permute(like, (1, 0)), [like.shape[1], 1, like.shape[0]])
        x = buf.load(d.type.layout)
        return gl.convert_layout(gl.permute(gl.reshape(x, [like.shape[1], like.shape[0]]), (1, 0)), like.type.layout,
                                 assert_trivial=True)

    @gluon.jit
    def _rescale_add(buf, alpha, x):
        """buf [4, BM] * alpha (per column) + x, x in _warp_sums' layout."""
        L: gl.constexpr = x.type.layout
        return buf.load(L) * gl.convert_layout(alpha, gl.SliceLayout(0, L), assert_trivial=True)[None, :] + x

    @gluon.jit
    def _col_key(n):
        return 16 * ((n >> 1) & 3) + 2 * (n >> 3) + (n & 1)

    @gluon.jit
    def _load_kv(ring, slot: gl.constexpr, k_ptr, v_ptr, k_ok, WITH_V: gl.constexpr):
        """Start the copies of one head's K (and V) tile into ring slot `slot` (cp.async, zero-filled
        outside [0, T)) as one commit group."""
        async_copy.async_copy_global_to_shared(ring[slot][0], k_ptr, mask=k_ok)
        if WITH_V:
            async_copy.async_copy_global_to_shared(ring[slot][1], v_ptr, mask=k_ok)
        async_copy.commit_group()

    @gluon.jit
    def _ready(ring, slot: gl.constexpr):
        """Wait for the second-newest commit group (this item's tiles; the next item's stay in flight)
        and make every thread's copies visible to the tensor cores. (Waiting first and issuing the next
        item's copies after this barrier saves a barrier per item but was 1-2% slower: the copies start
        later.)"""
        async_copy.wait_group(1)
        _thread_barrier()
        fence_async_shared()
        return ring[slot][0]

    @gluon.jit
    def _minus_k0(y, K0, rows, cc2, q2, D: gl.constexpr, T):
        """y [2, 32, 4, 16] of the first window minus the key-0 correction k0[0, c, row] (k 3: h = 1). The
        first window starts at key -2, so key 0 is lane q 0's entry u = 2 of every slot: one load per
        (row, slot) there instead of a masked load of every entry."""
        kv = gl.load(K0 + (cc2 * T + rows) + q2 * 0, mask=(cc2 < D) & (rows < T) & (q2 == 0), other=0.0)
        a = _unpack16(y)
        out = _pack16((a[0], a[1], a[2] - kv, a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12],
                       a[13], a[14], a[15]))
        return gl.convert_layout(out, y.type.layout)

    @gluon.jit
    def _conv1_input(xf):
        """Conv1's B operand [16, 128] (registers) from a row pair's XF rows xf [64, 64]: their head
        slots 0..15 side by side."""
        LX2: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [8, 1], [1, 0])          # [16, 64]
        x0 = xf.slice(0, 16, dim=0).load(LX2)
        x1 = xf.slice(32, 16, dim=0).load(LX2)
        return gl.reshape(gl.permute(gl.join(x0, x1), (0, 2, 1)), [16, 128])

    @gluon.jit
    def _conv_rows(XFpair, Xb, Zb, w1, w2, T1, K0, pp, cc, key0, pp2, cc2, q2, q0, ws, T,
                   D: gl.constexpr, KS: gl.constexpr, BM: gl.constexpr, WITH_K0: gl.constexpr):
        """Step 2 of a window (see the module docstring), two query rows at a time (one per warpgroup):
        for the rows 2 i', 2 i' + 1, XF (their conv1 inputs) -> f (over them). t1[c, i - j] of rows q0,
        q0 + 1 is read whole; each next pair's is this one shifted two keys right. WITH_K0: the window
        holds keys 0 .. k // 2 - 1 (the k0 correction)."""
        HALF: gl.constexpr = KS // 2
        ACC_Y: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                        instr_shape=[16, 64, 16])
        key = key0 + ws
        rows = q0 + pp
        dist = rows - key
        t1v = gl.load(T1 + (cc * (2 * T - 1) + T - 1 - key) + rows,
                      mask=(cc < D) & (dist < T) & (dist > -T), other=0.0)
        for ip in range(BM // 2):  # a run-time loop: unrolled, its code overflowed the instruction cache
            # the next pair's t1 at the window's first key and the one after (the only new distances)
            ne = q0 + 2 * ip + pp2 + 1 - ws
            e1 = gl.load(T1 + cc2 * (2 * T - 1) + T - 1 + ne + q2 * 0, mask=(cc2 < D) & (ne < T), other=0.0)
            e2 = gl.load(T1 + cc2 * (2 * T - 1) + T + ne + q2 * 0, mask=(cc2 < D) & (ne + 1 < T), other=0.0)
            Xb.store(_conv1_input(XFpair.index(ip)))
            _thread_barrier()
            fence_async_shared()
            y = _tapsum(warpgroup_mma(w1, Xb, gl.zeros([128, 128], gl.float32, ACC_Y), use_acc=False), KS)
            y += t1v
            if WITH_K0:
                y = _minus_k0(y, K0, q0 + 2 * ip + pp2, cc2, q2, D, T)
            z = gl.maximum(y, 0.01 * y)   # LeakyReLU in two instructions (FMUL, FMNMX), the same bits as where(y > 0, ..)
            # residual hidden map: minus leaky(t1) at every key (its conv2 is the host's g, in T2),
            # so the fp16 z and f stay small when the bias table is large (ALiBi at long T)
            z = gl.where((key >= 0) & (key < T), z, 0.0) - gl.maximum(t1v, 0.01 * t1v)
            t1v = _next_row(_next_row(t1v, e1), e2)
            Zb.store(_to_columns(z).to(gl.float16))
            _thread_barrier()
            fence_async_shared()
            f = _tapsum(warpgroup_mma(w2, Zb, gl.zeros([128, 128], gl.float32, ACC_Y), use_acc=False), KS)
            XFpair.index(ip).store(_to_rows(f).to(gl.float16))

    @gluon.jit
    def _dape_v2_fwd(Q, K, V, W1A, W2A, T1, K0, T2, O, LSE,
                     sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
                     T, scale,
                     H: gl.constexpr, D: gl.constexpr, KS: gl.constexpr, BM: gl.constexpr,
                     num_warps: gl.constexpr):
        HALF: gl.constexpr = KS // 2
        STEP: gl.constexpr = 64 - 4 * HALF
        LOG2E: gl.constexpr = 1.4426950408889634
        pid_m = gl.num_programs(0) - 1 - gl.program_id(0)  # late (heavy) query blocks first
        b = gl.program_id(1)
        q0 = pid_m * BM

        # register layouts
        LD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])          # [R, 64] global loads
        # two warpgroups: each takes one row of a pair in the convs and half the query rows of S^T, O^T
        ACC_Y: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                        instr_shape=[16, 64, 16])      # [128, 128] convs
        ACC_S: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                        instr_shape=[16, BM // 2, 16])  # [64, BM] S^T, O^T
        OPA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC_Y, k_width=2)
        LF3: gl.constexpr = gl.BlockedLayout([1, 1, 2], [1, 1, 32], [8, 1, 1], [2, 1, 0])  # [BM, 1, 64]
        SROW: gl.constexpr = gl.SliceLayout(0, ACC_S)   # per query row [BM]
        SKEY: gl.constexpr = gl.SliceLayout(1, ACC_S)   # per window column [64]

        # shared memory
        PLAIN2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        PLAIN3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
        PLAIN1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        NV64: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
        Qs = gl.allocate_shared_memory(gl.bfloat16, [H, BM, 64], gl.NVMMASharedLayout.get_default_for([BM, 64], gl.bfloat16))
        # 2 slots x (K, V), cp.async; one allocation per tile, so the compiler sees that a copy into one
        # does not touch the others (in one allocation it put a barrier after every copy)
        ring = ((gl.allocate_shared_memory(gl.bfloat16, [64, 64], NV64), gl.allocate_shared_memory(gl.bfloat16, [64, 64], NV64)),
                (gl.allocate_shared_memory(gl.bfloat16, [64, 64], NV64), gl.allocate_shared_memory(gl.bfloat16, [64, 64], NV64)))
        Pb = gl.allocate_shared_memory(gl.bfloat16, [64, BM], gl.NVMMASharedLayout.get_default_for([64, BM], gl.bfloat16))
        Xb = gl.allocate_shared_memory(gl.float16, [16, 128], gl.NVMMASharedLayout.get_default_for([16, 128], gl.float16))
        Zb = gl.allocate_shared_memory(gl.float16, [32, 128], gl.NVMMASharedLayout.get_default_for([32, 128], gl.float16))
        # XF[i]: row i's conv1 input (head slots 0..15, step 1), then its f (32 head slots, step 2)
        XF = gl.allocate_shared_memory(gl.float16, [BM, 32, 64], PLAIN3)
        XFpair = XF._reinterpret(gl.float16, [BM // 2, 64, 64], PLAIN2)  # the same bytes, a row pair per .index
        Os = gl.allocate_shared_memory(gl.float32, [H, 64, BM], PLAIN2)      # O^T per head
        Ms = gl.allocate_shared_memory(gl.float32, [H, BM], PLAIN1)
        # per-warp tile maxima, two buffers used in turn (one barrier per exchange); the rows are
        # read through a rank-1 view of the same bytes
        Mx = gl.allocate_shared_memory(gl.float32, [2, 4, BM], PLAIN2)
        Mxr = Mx._reinterpret(gl.float32, [8, BM], PLAIN1)
        Ls = gl.allocate_shared_memory(gl.float32, [H, 4, BM], PLAIN2)    # row sums, one part per warp

        # conv weights as shared-memory A operands (4 + 8 KB): as register operands they held 24 registers
        # for the whole kernel, which spilled. W2A stays in registers where its 8 KB do not fit (H 16).
        r128 = gl.arange(0, 128, gl.SliceLayout(1, LD))
        w1 = gl.allocate_shared_memory(gl.float16, [128, 16], gl.NVMMASharedLayout.get_default_for([128, 16], gl.float16))
        w1.store(gl.load(W1A + r128[:, None] * 16 + gl.arange(0, 16, gl.SliceLayout(0, LD))[None, :]))
        if H <= 15:
            w2 = gl.allocate_shared_memory(gl.float16, [128, 32], gl.NVMMASharedLayout.get_default_for([128, 32], gl.float16))
            w2.store(gl.load(W2A + r128[:, None] * 32 + gl.arange(0, 32, gl.SliceLayout(0, LD))[None, :]))
        else:
            r128a = gl.arange(0, 128, gl.SliceLayout(1, OPA))
            w2 = gl.load(W2A + r128a[:, None] * 32 + gl.arange(0, 32, gl.SliceLayout(0, OPA))[None, :])

        # state; conv1 input slots H..15 stay zero (step 2 writes f there, which is 0: W2A rows of slots >= H are 0)
        for h in gl.static_range(H):
            Os.index(h).store(gl.zeros([64, BM], gl.float32, ACC_S))
            Ms.index(h).store(gl.full([BM], -1.0e30, gl.float32, SROW))
            Ls.index(h).store(_warp_sums(gl.zeros([64, BM], gl.float32, ACC_S)))
        for h in gl.static_range(H, 16):
            XF.slice(h, 1, dim=1).store(gl.zeros([BM, 1, 64], gl.float16, LF3))

        # index vectors
        ld_r = gl.arange(0, BM, gl.SliceLayout(1, LD))
        ld_n = gl.arange(0, 64, gl.SliceLayout(1, LD))
        ld_d = gl.arange(0, 64, gl.SliceLayout(0, LD))
        q_rows = q0 + ld_r
        q_ok = (q_rows < T)[:, None]
        for h in gl.static_range(H):
            Qs.index(h).store(gl.load(Q + b * sqb + h * sqh + q_rows[:, None] * sqt + ld_d[None, :], mask=q_ok, other=0.0))
        s_n = gl.arange(0, 64, SKEY)
        s_off = _col_key(s_n)                           # key offset of window column n
        s_rows = q0 + gl.arange(0, BM, SROW)
        inner = (s_off >= 2 * HALF) & (s_off < 64 - 2 * HALF)

        # K / V tiles stream through a 2-slot ring, one item ahead: item n = step 1's K of head h
        # (n = 2 H w + h) or step 3's K and V of head h (n = 2 H w + H + h), in slot n % 2 (2 H is even,
        # so the slots are compile-time constants).
        ws = -2 * HALF
        k_keys = ws + _col_key(ld_n)
        k_ok = ((k_keys >= 0) & (k_keys < T))[:, None]
        _load_kv(ring, 0, K + b * skb + k_keys[:, None] * skt + ld_d[None, :], 0, k_ok, False)

        # index tensors of the [32 slots, 4 q, 16 u] conv tiles (the tap sum's layout)
        y0 = _tapsum(gl.zeros([128, 128], gl.float32, ACC_Y), KS)
        pp, cc, key0 = _slot_key(y0)
        pp2, cc2, q2 = _slot_run(_lane_shift(_unpack16(y0)[15], -1))   # [2, 1, 1], [1, 32, 1], [1, 1, 4]: one key per run

        last = gl.minimum(q0 + BM, T) - 1
        for ws in range(-2 * HALF, last - 2 * HALF + 1, STEP):
            k_keys = ws + _col_key(ld_n)
            k_ok = ((k_keys >= 0) & (k_keys < T))[:, None]
            k_ptr = K + b * skb + k_keys[:, None] * skt + ld_d[None, :]   # per window; + h * skh per head
            v_ptr = V + b * svb + k_keys[:, None] * svt + ld_d[None, :]
            s_keys = ws + s_off
            tril = (s_keys[:, None] <= s_rows[None, :]) & (s_keys >= 0)[:, None] & (s_keys < T)[:, None]
            t2_ptr = T2 + (s_rows[None, :] - s_keys[:, None] + T - 1)     # + h * (2T - 1) per head

            # 1. scores of every head -> conv1 input (fp16, tril applied)
            for h in gl.static_range(H):
                _thread_barrier()   # slot (h + 1) % 2 is free: its last reader (the previous item) is done
                if h + 1 < H:
                    _load_kv(ring, (h + 1) % 2, k_ptr + (h + 1) * skh, 0, k_ok, False)
                else:
                    _load_kv(ring, (h + 1) % 2, k_ptr, v_ptr, k_ok, True)
                kb = _ready(ring, h % 2)
                sT = warpgroup_mma(kb, Qs.index(h).permute((1, 0)), gl.zeros([64, BM], gl.float32, ACC_S), use_acc=False)
                sT = gl.where(tril, sT * scale, 0.0)
                x = gl.reshape(gl.permute(sT.to(gl.float16), (1, 0)), [BM, 1, 64])
                XF.slice(h, 1, dim=1).store(x)   # in S^T's layout: a conversion costs a barrier
            _thread_barrier()

            # 2. per query row: conv1 -> tap sum -> t1, k0 -> LeakyReLU -> conv2 -> tap sum -> f
            # (two copies of the row loop: only the first window holds keys 0 .. k // 2 - 1, the k0 correction)
            if HALF > 0:
                if ws < HALF:
                    _conv_rows(XFpair, Xb, Zb, w1, w2, T1, K0, pp, cc, key0, pp2, cc2, q2, q0, ws, T, D, KS, BM, True)
                else:
                    _conv_rows(XFpair, Xb, Zb, w1, w2, T1, K0, pp, cc, key0, pp2, cc2, q2, q0, ws, T, D, KS, BM, False)
            else:
                _conv_rows(XFpair, Xb, Zb, w1, w2, T1, K0, pp, cc, key0, pp2, cc2, q2, q0, ws, T, D, KS, BM, False)
            _thread_barrier()

            # 3. per head: logits, online softmax, O^T += V^T P^T
            valid = tril & inner[:, None] & (s_rows < T)[None, :]
            t2n = gl.load(t2_ptr, mask=valid, other=0.0)
            for h in gl.static_range(H):
                t2 = t2n
                if h + 1 < H:  # the next head's bias, a head ahead (a gather: its latency was exposed)
                    t2n = gl.load(t2_ptr + (h + 1) * (2 * T - 1), mask=valid, other=0.0)
                _thread_barrier()
                if h + 1 < H:
                    _load_kv(ring, (H + h + 1) % 2, k_ptr + (h + 1) * skh, v_ptr + (h + 1) * svh, k_ok, True)
                else:  # the next window's first item
                    n_keys = ws + STEP + _col_key(ld_n)
                    _load_kv(ring, (H + h + 1) % 2, K + b * skb + n_keys[:, None] * skt + ld_d[None, :], 0,
                             ((n_keys >= 0) & (n_keys < T))[:, None], False)
                kb = _ready(ring, (H + h) % 2)
                vb = ring[(H + h) % 2][1]
                sT = warpgroup_mma(kb, Qs.index(h).permute((1, 0)), gl.zeros([64, BM], gl.float32, ACC_S), use_acc=False)
                fT = _load_T(XF.slice(h, 1, dim=1), sT)   # in S^T's layout: a conversion costs a barrier
                lg = gl.where(valid, sT * scale + t2 + fT.to(gl.float32), float("-inf"))
                m_old = Ms.index(h).load(SROW)
                Mx.index(h % 2).store(_warp_max(lg))
                _thread_barrier()
                m_new = gl.maximum(gl.maximum(m_old, gl.maximum(Mxr.index(4 * (h % 2)).load(SROW), Mxr.index(4 * (h % 2) + 1).load(SROW))),
                                   gl.maximum(Mxr.index(4 * (h % 2) + 2).load(SROW), Mxr.index(4 * (h % 2) + 3).load(SROW)))
                alpha = gl.exp2((m_old - m_new) * LOG2E)
                p = gl.exp2((lg - m_new[None, :]) * LOG2E)
                # row sums: each warp keeps its own part (its 16 keys of every window), so no exchange
                # between warps here; the parts are added once, in the epilogue
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

        # epilogue: O = O^T / l, LSE = m + log l
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


def prepare(w1, b1, w2, b2, table, T: int, H: int, device):
    """Host-side operands: W1A, W2A (fp16), t1 [D, 2T - 1], k0 [max(k // 2, 1), D, T], t2 + g
    [H, 2T - 1] (fp32, contiguous; g = residual_table). Without a bias table, a zero table with zero
    bias-channel weights."""
    import torch

    with torch.autocast(torch.device(device).type, enabled=False):  # fp32 tables also under autocast
        return _prepare(w1, b1, w2, b2, table, T, H, device)


def _prepare(w1, b1, w2, b2, table, T: int, H: int, device):
    import torch

    from .reference import dape_v2_tables, residual_table

    f32 = torch.float32
    if table is None:
        table = torch.zeros(H, 2 * T - 1, dtype=f32, device=device)
        w1full = torch.cat([w1, torch.zeros_like(w1)], dim=1)
    else:
        w1full = w1
    t1, k0, t2 = dape_v2_tables(w1full.to(f32), b1.to(f32), b2.to(f32), table.to(f32), T)
    if k0.shape[0] == 0:
        k0 = torch.zeros(1, w1.shape[0], T, dtype=f32, device=device)
    t2 = t2 + residual_table(t1, w2.to(f32))
    W1A, W2A = conv_weights(w1, w2, H, device)
    return W1A, W2A, t1.contiguous(), k0.contiguous(), t2.contiguous()


# The hidden map z - leaky(t1) and f - g are fp16 in shared memory. In the window's padding keys and at
# keys < k // 2 they are table values themselves (-leaky(t1); about -k0), and f is conv2 of them: with
# m_c = max(|t1[c]|, |k0[c]|), |z_c| <= m_c and |f_h| <= sum_{c,t} |w2[h,c,t]| m_c. Past fp16's largest
# value (65504) they turn to inf and the output to NaN (Kerple-power at T 2048: |t1| ~ 4e5). FP16_SAFE
# leaves a factor 4 for conv1 of the scores, which the host cannot see, on top of the tables. With the
# model's initialisation: ALiBi 1e3 at T 1536, 1e4 at 16384, 2e4 at 32768; Kerple-log 20 at 16384.
FP16_SAFE = 2.0 ** 14


def range_reason(t1, k0, w2):
    """Why this forward's fp16 conv path cannot hold DAPE V2 with these host tables (prepare's t1,
    k0; conv2's weight w2), or None: the bound above against FP16_SAFE. One host sync; the caller
    keeps the answer with the cached tables."""
    import torch

    with torch.autocast(t1.device.type, enabled=False):
        m = torch.maximum(t1.detach().float().abs().amax(1), k0.detach().float().abs().amax((0, 2)))  # [D]
        f = (w2.detach().float()[:, :, 0, :].abs().sum(-1) * m).sum(1).max()
        bound = torch.maximum(f, m.max()).item()
    if bound > FP16_SAFE:
        return f"its fp16 hidden map would overflow (tables bound {bound:.3g} > {FP16_SAFE:g})"
    return None


def unsupported_reason(q, H: int, D: int, ks: int):
    """Why this forward cannot run for q [B, H, T, d] with D hidden channels and kernel size ks, or None:
    an sm_90 GPU, triton 3.6 (the Gluon API it is written and GPU-tested against), d 64, H <= 16,
    D <= 32, k in (1, 3), bf16."""
    if _GLUON_ERROR is not None:
        return f"triton Gluon (Hopper) unavailable: {_GLUON_ERROR!r}"
    import torch
    import triton

    if not triton.__version__.startswith("3.6."):
        return f"the Gluon forward is written for triton 3.6, not {triton.__version__}"
    if not q.is_cuda or torch.cuda.get_device_capability(q.device) != (9, 0):
        return "the Gluon forward needs an sm_90 (Hopper) GPU"
    if q.shape[-1] != 64 or H > HP or D > CS or ks not in (1, 3) or q.dtype != torch.bfloat16:
        return (f"the Gluon forward takes d 64, H <= 16, D <= 32, k in (1, 3), bf16 "
                f"(got d {q.shape[-1]}, H {H}, D {D}, k {ks}, {q.dtype})")
    return None


def _aligned(x):
    """x itself where the kernel's cp.async copies can take it (unit stride on d; every other stride a
    multiple of 16 elements and the base 16-byte aligned, which triton's launcher then tells the
    compiler), else a fresh contiguous copy."""
    import torch

    ok = x.stride(-1) == 1 and all(s % 16 == 0 for s in x.stride()[:-1]) and x.data_ptr() % 16 == 0
    return x if ok else x.clone(memory_format=torch.contiguous_format)


def dape_v2_gluon_forward(q, k, v, w1, b1, w2, b2, table=None, prepared=None):
    """Forward of causal DAPE V2 attention, q, k, v [B, H, T, 64] bf16 on an sm_90 GPU; returns
    (o [B, H, T, 64] bf16, lse [B, H, T] fp32, natural log), like the Triton kernel's forward.
    prepared: prepare()'s operands for these weights, table and T, if the caller has them (tables.cached)."""
    import torch

    B, H, T, dh = q.shape
    D, ks = w1.shape[0], w1.shape[-1]
    if dh != 64 or H > HP or D > CS or ks not in (1, 3) or q.dtype != torch.bfloat16:
        raise NotImplementedError(f"gluon DAPE V2 forward: d 64, H <= 16, D <= 32, k in (1, 3), bf16 only "
                                  f"(got d {dh}, H {H}, D {D}, k {ks}, {q.dtype})")
    q, k, v = (_aligned(x) for x in (q, k, v))
    W1A, W2A, t1, k0, t2 = prepared if prepared is not None else prepare(w1, b1, w2, b2, table, T, H, q.device)
    o = torch.empty_like(q)
    lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    grid = ((T + BM - 1) // BM, B)
    _kernels()["fwd"][grid](q, k, v, W1A, W2A, t1, k0, t2, o, lse,
                            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                            T, 1.0 / math.sqrt(dh), H=H, D=D, KS=ks, BM=BM, num_warps=NUM_WARPS)
    return o, lse
