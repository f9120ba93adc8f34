"""Two DAPE V2 forward schedules emulated in plain PyTorch on the CPU: gluon_schedule, the Gluon
kernel's own (gluon.py: windows with a 2h-key halo; at the end of this file), and dape_v2_emulate, the
planned Hopper forward kernel (shared KERNEL_PLAN.md, sections 1-3) with its exact tile schedule, so
that each schedule's bookkeeping is tested on a CPU against reference.dape_v2_reference and the
kernel has a readable definition. Nothing here is fast. (This file is outside the kernel-source hash:
runinfo.kernel_sources_hash.)

    out = softmax_causal(S + Bias + f(tril([S; Bias]))) V,   S = Q K^T / sqrt(d),  k = kernel size, h = k // 2

Host side. Rewrite A (reference.dape_v2_tables): conv1's bias channels become the per-distance table
t1[c, i - j] (b1 folded in) with the key-0 correction k0 (keys j < h read padding, which t1 counts as
bias), and Bias + b2 becomes t2[h, i - j]. conv1 then takes only the H score channels, as the matmul
W1s [(tap, c), h] (rows tap-major); conv2 is W2s [c, (tap, h)]. Without a bias table t1 is b1 and t2
is b2 at every distance, and there is no correction (b1 is added at padded keys too, as in the
reference).

Grid: one program ("CTA") per (block of block_m query rows, batch entry), holding all heads of its
rows. The last block's rows past T are computed on zero-filled q (they read clamped table entries) and
never stored. Each program walks key tiles of block_n keys from key 0 up to its diagonal:

1. S_h = scale * Q_h K_h^T for the tile's keys [j0, j0 + block_n), every head, fp32. On tiles that
   cross the diagonal, tril: scores of keys after the row become 0 (not -inf; the convs see zeros
   there, as at the padding left of key 0 and right of key T - 1).
2. conv1 as one matmul over channels, pairs on N: Y[(tap, c), pairs] = W1s X^T, where X holds one
   row per (query, key) pair with its H scores (rounded to the conv dtype). The pair rows are written
   in a bit-permuted order (pair_permutation): in each group of 64 accumulator columns, column
   8m + 2q + b holds pair 16q + 2m + b. A wgmma accumulator gives the thread at quad position q the
   columns 8m + 2q + b (m = 0..7, b = 0, 1), so that thread gets pairs 16q .. 16q + 15: reading its own
   registers in order is the un-permutation (a rename, no data moves between threads). Pairs are
   numbered (row, key) row-major and block_n is a multiple of 16, so each such run is 16 consecutive
   keys of one query row.
3. conv1's tap sum along keys, with a lag: the hidden map at key u needs tap t's product at key
   u + t - h, up to h keys ahead. So a tile emits the hidden map at keys [j0 - h, j0 + block_n - h):
   every output then reads only its own 16-key run and the 2h keys before it, i.e. the end of the
   run to its left (a lane shuffle) or, for a tile's first run, the carry: the products of the last 2h
   keys of the previous tile (zero before key 0: the padding). Then + t1[c, i - u], minus k0 at keys
   u < h, LeakyReLU(0.01), zero at keys u < 0 or u >= T (conv2's padding), rounded to the conv dtype.
4. conv2 as one matmul, pairs on M: G[pairs, (tap, h)] = Z W2s, and its tap sum with the same lag
   and carry: F at keys [j0 - 2h, j0 + block_n - 2h). (The kernel orders conv2's M rows so that a
   thread holds consecutive keys and sums the taps in-thread; the order of M rows does not change
   the products, so the emulator keeps the natural order.)
5. Logits at keys [j0 - 2h, j0 + block_n - 2h): S + t2[h, i - j] + F, with the fp32 S of the previous
   tile's last 2h keys carried; causal mask (-inf for j > i and for j < 0); online softmax per
   (row, head) in base 2 (log2(e) multiplies the finished logits: it cannot be folded into the QK
   scale, because the conv needs S itself); P rounded to V's dtype; O += P V_h with V read at the
   lagged keys [j0 - 2h, j0 + block_n - 2h) (zero-filled before key 0).
6. Flush: logits lag 2h keys, so the walk goes on until the emitted keys pass the block's last row.
   A tile whose first key is past that row (one at most while 2h < block_n) holds only zero scores:
   no QK, no K load; it just pushes the carries through. k = 1 has no lag, no carry, no flush.
Finally O = acc / l and lse = ln(sum_j exp(logit_ij)) per (row, head).

Lazy rescaling: the running max m (base 2) moves only when a tile's max exceeds it by more than
RESCALE_THRESHOLD; otherwise P is exponentiated against the stale max (P <= 2^8, fine for fp32 l
and bf16 P) and acc, l are not rescaled. The result is the same; the kernel skips most rescales.

Precision. Accumulators are fp32 (fp64 for fp64 inputs, so the schedule can be checked to 1e-10).
With half (torch.float16 or torch.bfloat16) set, the operands of both conv matmuls (X, W1s, Z, W2s)
are rounded to it; t1, k0, t2 stay fp32. P is rounded to V's dtype when V is 16-bit (the PV
tensor-core matmul takes both operands in one dtype); l sums the unrounded P.

Where the reference decides details the plan leaves open:
- The residual S in the logits is the unrounded fp32 S (the reference adds the scores, not the
  conv's input), so the kernel must carry the fp32 S of the last 2h keys, not re-read the rounded
  pair rows.
- The hidden map is not zero past the diagonal: at keys i < u < T it is LeakyReLU(t1[c, i - u] plus
  the taps that reach back to keys <= i), and conv2 reads it. Only keys past T - 1 (and before 0) are
  zero. So the hidden map needs a key < T mask, not a causal one (and a row's output depends on
  whether the h keys after it exist: see the decode cache's halo).
- The permutation acts on groups of 64 pairs; with block_n < 64 a group spans 64 / block_n rows. So
  block_m * block_n must be a multiple of 64 (wgmma's N granularity for this layout).
"""

import math

import torch
from torch.nn import functional as F

from .reference import dape_v2_tables

LOG2E = 1.0 / math.log(2.0)
RESCALE_THRESHOLD = 8.0  # base-2 units: how far the true row max may run ahead of the stale one
RUN = 16  # consecutive keys one thread holds after the pair permutation


def pair_permutation(n: int) -> torch.Tensor:
    """perm[a] = the pair that conv1's accumulator column a holds, for n pairs (a multiple of 64):
    in each group of 64 columns, column 8m + 2q + b holds pair 16q + 2m + b."""
    a = torch.arange(n)
    g, m, q, b = a // 64, a % 64 // 8, a % 8 // 2, a % 2
    return 64 * g + 16 * q + 2 * m + b


def _lagged_tap_sum(carry, tile):
    """Sum of a conv's taps along the keys, each tap shifted, for a tile of n keys starting at j0.
    tile [k, ..., n]: tap t's products at keys j0 .. j0 + n - 1; carry [k, ..., 2h]: the products at
    the 2h keys before j0. Returns (out [..., n], the next carry), out[o] being the conv's output at
    key j0 - h + o: out[o] = sum_t product_t(j0 - 2h + o + t). Each run of RUN keys reads itself and
    the 2h keys before it: the end of the run on its left, or the carry for the tile's first run."""
    k = tile.shape[0]
    stream = torch.cat([carry, tile], -1)  # keys j0 - 2h .. j0 + n - 1
    windows = stream.unfold(-1, RUN + k - 1, RUN)  # [k, ..., n / RUN, RUN + 2h]: a run and its left halo
    out = sum(windows[t][..., t: t + RUN] for t in range(k))
    return out.flatten(-2), stream[..., stream.shape[-1] - (k - 1):]


def _load(x, start, n):
    """x[:, :, start:start + n] of a [B, H, T, d] tensor, zero-filled outside 0..T-1 (as TMA loads)."""
    T = x.shape[2]
    out = x.new_zeros(x.shape[0], x.shape[1], n, x.shape[3])
    lo, hi = max(start, 0), min(start + n, T)
    if lo < hi:
        out[:, :, lo - start: hi - start] = x[:, :, lo:hi]
    return out


def _dist(rows, keys, T):
    """Table index (i - j) + T - 1 of every (row, key) [len(rows), len(keys)], clamped into the table:
    the entries it clamps are masked (keys < 0 or >= T) or belong to rows past T, never stored."""
    return (rows[:, None] - keys[None, :] + T - 1).clamp(0, 2 * T - 2)


def _gather(t, idx):
    """t[:, idx] for a [C, 2T - 1] table and an index [rows, keys] (index_select: far faster on a CPU)."""
    return t.index_select(1, idx.flatten()).view(t.shape[0], *idx.shape)


def dape_v2_emulate(q, k, v, w1, b1, w2, b2, table=None, *, block_m: int = 32, block_n: int = 64, half=None):
    """DAPE V2 causal attention of q, k, v [B, H, T, d] through the forward kernel's tile schedule
    (module docstring). Arguments as reference.dape_v2_reference: conv weights w1 [D, C, 1, k]
    (C = 2H with a bias table, H without), b1 [D], w2 [H, D, 1, k], b2 [H]; table the bias table
    [H, 2T - 1] (entry (i - j) + T - 1) or None. block_m query rows per program, block_n keys per
    tile (powers of two, block_n >= 16, block_m * block_n a multiple of 64); half: None or the 16-bit
    dtype of the conv matmul operands. Returns (o [B, H, T, d] in q's dtype, lse [B, H, T], natural
    log, fp32 or fp64 for fp64 inputs)."""
    B, H, T, d = q.shape
    D, ks = w1.shape[0], w1.shape[-1]
    if (block_m < 1 or block_m & (block_m - 1) or block_n & (block_n - 1) or block_n < RUN
            or block_m * block_n % 64):
        raise ValueError(f"block_m, block_n must be powers of two with block_n >= {RUN} and block_m * "
                         f"block_n a multiple of 64, got {block_m}, {block_n}")
    hk = ks // 2
    lag = 2 * hk
    acc_t = torch.float64 if q.dtype == torch.float64 else torch.float32
    conv_t = half or acc_t
    p_t = v.dtype if v.dtype in (torch.float16, torch.bfloat16) else acc_t

    def rounded(x, dtype):
        return x.to(dtype).to(acc_t)

    # host side: rewrite A's tables and the two conv matmuls' weights
    w1, b1, w2, b2 = (w.to(acc_t) for w in (w1, b1, w2, b2))
    if table is not None:
        t1, k0, t2 = dape_v2_tables(w1, b1, b2, table.to(acc_t), T)
    else:
        t1, k0, t2 = b1[:, None].expand(D, 2 * T - 1), w1.new_zeros(0, D, T), b2[:, None].expand(H, 2 * T - 1)
    W1s = rounded(w1[:, :H, 0, :].permute(2, 0, 1).reshape(ks * D, H), conv_t)  # rows (tap, c)
    W2s = rounded(w2[:, :, 0, :].permute(1, 2, 0).reshape(D, ks * H), conv_t)  # columns (tap, h)
    perm = pair_permutation(block_m * block_n)
    unperm = torch.argsort(perm)  # thread registers in order: column unperm[p] holds pair p
    scale = d ** -0.5

    o = q.new_empty(B, H, T, d)
    lse = torch.empty(B, H, T, dtype=acc_t)
    for i0 in range(0, T, block_m):  # one program per query block (and batch entry)
        rows = torch.arange(i0, i0 + block_m)
        last = min(i0 + block_m, T) - 1  # the block's last real row: its diagonal
        trow = rows.clamp(max=T - 1)  # rows past T read some table entry; they are never stored
        qb = _load(q, i0, block_m).to(acc_t)
        m = torch.full((B, H, block_m), -1e30, dtype=acc_t)  # finite: exp2(-inf - m) = 0, never NaN
        l = torch.zeros(B, H, block_m, dtype=acc_t)
        acc = torch.zeros(B, H, block_m, d, dtype=acc_t)
        # the carries: each tile's last 2h keys, handed to the next tile (zero = padding before key 0)
        s_carry = torch.zeros(B, H, block_m, lag, dtype=acc_t)  # fp32 S, for the logits' residual
        y_carry = torch.zeros(ks, B, D, block_m, lag, dtype=acc_t)  # conv1's per-tap products
        g_carry = torch.zeros(ks, B, H, block_m, lag, dtype=acc_t)  # conv2's per-tap products
        for j0 in range(0, last + lag + 1, block_n):  # until the emitted keys j0 - 2h.. pass `last`
            keys = j0 + torch.arange(block_n)
            # 1. scores
            if j0 <= last:
                S = scale * qb @ _load(k, j0, block_n).to(acc_t).transpose(-1, -2)  # [B, H, BM, BN]
                if j0 + block_n - 1 > i0:  # the tile crosses the diagonal: tril (0, not -inf)
                    S = S.masked_fill(keys[None, :] > rows[:, None], 0.0)
            else:  # flush tile: every key is past the diagonal, so S = 0 without a QK
                S = torch.zeros(B, H, block_m, block_n, dtype=acc_t)
            # 2. conv1: pair rows (all heads of one (row, key)) in permuted order, channels-first matmul
            X = rounded(S, conv_t).permute(0, 2, 3, 1).reshape(B, block_m * block_n, H)
            Y_acc = W1s @ X.index_select(1, perm).transpose(1, 2)  # [B, (tap, c), accumulator columns]
            # each thread reads its own columns in order: 16 consecutive keys. [tap, B, c, row, key]
            Y = Y_acc.index_select(2, unperm).reshape(B, ks, D, block_m, block_n).transpose(0, 1)
            # 3. tap sum with the carry: hidden map at keys j0 - h ..
            y, y_carry = _lagged_tap_sum(y_carry, Y)
            hkeys = keys - hk
            y = y + _gather(t1, _dist(trow, hkeys, T))
            for j in range(k0.shape[0]):  # the key-0 correction, on the tile whose hidden map holds key j < h
                if j0 - hk <= j < j0 - hk + block_n:
                    y[..., j - (j0 - hk)] -= k0[j][:, trow]
            z = F.leaky_relu(y, 0.01).masked_fill(((hkeys < 0) | (hkeys >= T))[None, None, None, :], 0.0)
            Z = rounded(z, conv_t).permute(0, 2, 3, 1)  # [B, row, key, c]: pairs on M
            # 4. conv2 and its tap sum with the carry: F at keys j0 - 2h ..
            G = (Z @ W2s).reshape(B, block_m, block_n, ks, H).permute(3, 0, 4, 1, 2)  # [tap, B, h, row, key]
            f, g_carry = _lagged_tap_sum(g_carry, G)
            # 5. logits at keys j0 - 2h .. j0 + BN - 2h - 1, online softmax, PV
            lkeys = keys - lag
            s_stream = torch.cat([s_carry, S], -1)
            s_res, s_carry = s_stream[..., :block_n], s_stream[..., block_n:]
            logits = s_res + _gather(t2, _dist(trow, lkeys, T)) + f
            causal = (lkeys[None, :] <= rows[:, None]) & (lkeys >= 0)[None, :]
            x2 = (logits * LOG2E).masked_fill(~causal, float("-inf"))
            m_tile = x2.amax(-1)
            m_new = torch.where(m_tile > m + RESCALE_THRESHOLD, m_tile, m)  # lazy: move only on a large jump
            alpha = torch.exp2(m - m_new)  # 1 where m stayed (the kernel skips those rescales)
            p = torch.exp2(x2 - m_new[..., None])
            l = l * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + rounded(p, p_t) @ _load(v, j0 - lag, block_n).to(acc_t)
            m = m_new
        n = last + 1 - i0
        o[:, :, i0:last + 1] = (acc / l[..., None])[:, :, :n].to(q.dtype)
        lse[:, :, i0:last + 1] = ((m + torch.log2(l)) / LOG2E)[:, :, :n]
    return o, lse


def gluon_schedule(q, k, v, w1, b1, w2, b2, tab, half_dtype=None, p_dtype=None, halo=None):
    """The Gluon forward emulated on the CPU with its tile schedule (gluon.py's module docstring): CTAs
    of BM query rows; windows of BNW keys from ws = -2h stepping BNW - 4h, each keeping the outputs
    [ws + 2h, ws + BNW - 2h) (halo: the keys each side, 2h in the kernel); S of the window's keys,
    tril, conv1 + tap sum with the kernel's wrap-around at the window edges (its lane shuffle
    rotates within a quad; the wrapped keys are the halo), + t1 - k0 (first window only), LeakyReLU,
    zero outside [0, T), minus leaky(t1) (the residual hidden map), conv2 + tap sum; logits S + (t2 + g)
    + f masked to the window's outputs; online softmax over windows in base 2 from m = -1e30. The key
    permutation is storage order only and is left out. half_dtype rounds the conv operands and f as the
    kernel does (fp16), p_dtype rounds P (bf16 in the kernel); None keeps q's dtype (tables: prepare's
    fp32)."""
    from . import gluon as G

    B, H, T, d = q.shape
    dt = q.dtype
    rnd = (lambda x: x) if half_dtype is None else (lambda x: x.to(half_dtype).to(dt))
    rnd_p = (lambda x: x) if p_dtype is None else (lambda x: x.to(p_dtype).to(dt))
    h = w1.shape[-1] // 2
    halo = 2 * h if halo is None else halo
    _, _, t1, k0, t2 = G.prepare(w1.to(dt), b1.to(dt), w2.to(dt), b2.to(dt), tab, T, H, q.device)
    t1, k0, t2 = t1.to(dt), k0.to(dt), t2.to(dt)
    W1, W2 = rnd(w1[:, :H, 0].to(dt)), rnd(w2[:, :, 0].to(dt))          # [D, H, k], [H, D, k]

    def tap_sum(Y):  # Y [C, k, rows, keys] -> sum_t Y_t[j + t - h], circular over the window's keys
        return sum(torch.roll(Y[:, t], h - t, dims=-1) for t in range(Y.shape[1]))

    def gather(table, dist):  # table[:, dist + T - 1], 0 at |dist| >= T (as the kernel loads it)
        return torch.where(dist.abs() < T, table[:, (dist + T - 1).clamp(0, 2 * T - 2)], 0.0)

    out = torch.zeros_like(q)
    lse = torch.zeros(B, H, T, dtype=dt)
    cols = torch.arange(G.BNW)
    inner = (cols >= halo) & (cols < G.BNW - halo)
    for b in range(B):
        for q0 in range(0, T, G.BM):
            rows = q0 + torch.arange(G.BM)
            r_ok = rows < T
            Q = q[b][:, rows.clamp(max=T - 1)] * r_ok[:, None]
            m = torch.full((H, G.BM), -1.0e30, dtype=dt)
            l = torch.zeros(H, G.BM, dtype=dt)
            O = torch.zeros(H, G.BM, d, dtype=dt)
            last = min(q0 + G.BM, T) - 1
            for ws in range(-halo, last - halo + 1, G.BNW - 2 * halo):
                keys = ws + cols
                k_ok = (keys >= 0) & (keys < T)
                K, V = (x[b][:, keys.clamp(0, T - 1)] * k_ok[:, None] for x in (k, v))
                S = Q @ K.transpose(-1, -2) / d ** 0.5                        # [H, BM, BNW]
                tril = (keys[None, :] <= rows[:, None]) & k_ok[None, :]
                dist = rows[:, None] - keys[None, :]
                t1v = gather(t1, dist)                                        # [D, BM, BNW]
                y = tap_sum(torch.einsum("cht,hij->ctij", W1, rnd(torch.where(tril, S, 0.0)))) + t1v
                if ws < h:  # the first window holds keys 0 .. h - 1
                    for j in range(h):
                        y[:, :, j - ws] -= k0[j][:, rows.clamp(max=T - 1)] * r_ok
                z = torch.where(k_ok, F.leaky_relu(y, 0.01), 0.0) - F.leaky_relu(t1v, 0.01)
                f = rnd(tap_sum(torch.einsum("hct,cij->htij", W2, rnd(z))))
                valid = tril & inner[None, :] & r_ok[:, None]
                lg = torch.where(valid, S + gather(t2, dist) + f, float("-inf"))
                m_new = torch.maximum(m, lg.amax(-1))
                alpha = torch.exp2((m - m_new) * math.log2(math.e))
                p = torch.exp2((lg - m_new[..., None]) * math.log2(math.e))
                l = l * alpha + p.sum(-1)
                O = O * alpha[..., None] + rnd_p(p) @ V
                m = m_new
            l = l.clamp_min(1e-30)
            out[b][:, rows[r_ok]] = (O / l[..., None])[:, r_ok].to(dt)
            lse[b][:, rows[r_ok]] = (m + l.log())[:, r_ok]
    return out, lse
