"""The DAPE V2 forward chain (chain.py) emulated on the CPU with the kernel's exact schedule, so that its
bookkeeping is tested against reference.dape_v2_reference in float64 and its rounding points are
written down in one readable place. Nothing here is fast. The key permutation inside a window is
storage order only (tested with gluon.py's helpers) and is left out.

Schedule (one program per block of BM query rows of one batch entry, all heads; windows of BNW keys
from ws = -2h stepping BNW - 4h, a window's outputs being its keys [ws + 2h, ws + BNW - 2h)):
 1. per head, once: S_h = scale Q_h K_h^T over the window's keys (fp32 accumulator), tril (0 above the
    diagonal and outside [0, T)), rounded to the conv dtype: this one copy is conv1's input AND the
    scores of the logits (no second QK: the difference from gluon.py, which recomputes S in fp32).
 2. per query row: conv1 over the head channels + tap sum (circular within the window: the wrapped
    keys are the halo), + t1[c, i - u], - k0 at keys u < h (the window holding them), LeakyReLU, zero
    outside [0, T), minus leaky(t1) (the residual hidden map), rounded; conv2 + tap sum -> f - g,
    rounded.
 3. per head: logits S + (t2 + g)[h, i - j] + (f - g) on the window's outputs and the causal triangle,
    online softmax over the windows (base 2, from m = -1e30), P rounded to the P dtype, O += P V_h.
Finally O = acc / l and lse = m + ln l. How K and V tiles reach shared memory (the ring of RING slots)
changes no value; ring_reads replays that protocol on tile names.

Tables (the host's, tables.cached): t1, k0 and t2 of rewrite A (reference.dape_v2_tables) and
g = reference.residual_table (conv2 of leaky(t1) by distance) folded into t2; without a bias table, a zero table and zero bias-channel
weights (as gluon.prepare). Here they are built in the accumulator dtype (float64 for float64 inputs),
so the float64 check is exact up to rounding.
"""

import math

import torch
from torch.nn import functional as F

from .reference import dape_v2_tables

BM = 16    # query rows per program (chain.BM)
BNW = 64   # keys per window (chain.BNW)


def chain_tables(w1, b1, w2, b2, table, T: int, H: int):
    """t1 [D, 2T - 1], k0 [h, D, T], t2 + g [H, 2T - 1] in w1's dtype (the kernel's are fp32)."""
    if table is None:
        table = w1.new_zeros(H, 2 * T - 1)
        w1 = torch.cat([w1, torch.zeros_like(w1)], dim=1)
    t1, k0, t2 = dape_v2_tables(w1, b1, b2, table.to(w1.dtype), T)
    return t1, k0, t2 + _residual(t1, w2)


def _residual(t1, w2):
    """reference.residual_table's g in t1's own dtype (that one is fp32 always, as the kernel reads it)."""
    h, n = w2.shape[-1] // 2, t1.shape[1]
    lt = F.pad(F.leaky_relu(t1, 0.01), (h, h))
    return sum(w2[:, :, 0, t] @ lt[:, 2 * h - t: 2 * h - t + n] for t in range(w2.shape[-1]))


def windows(q0: int, T: int, ks: int, block_m: int = BM):
    """Window starts of the program whose first row is q0: from -2h while the window's first output
    key ws + 2h is at most the block's last real row."""
    h = ks // 2
    last = min(q0 + block_m, T) - 1
    return range(-2 * h, last - 2 * h + 1, BNW - 4 * h)


def chain_schedule(q, k, v, w1, b1, w2, b2, table=None, *, half=None, p_dtype=None, block_m: int = BM,
                   fused_l: bool = False):
    """DAPE V2 causal attention of q, k, v [B, H, T, d] through the chain's schedule (module
    docstring); weights and table as reference.dape_v2_reference. half: the conv dtype (S, X, Z, f
    rounded to it; the kernel's is fp16), p_dtype: P's (bf16 in the kernel); None keeps full
    precision. fused_l: S + f rounded to the conv dtype once more before t2 is added (chain_ws.py
    keeps L = S + f in place of S), except at keys < 2 (k // 2) (chain_ws._qk says why). Returns (o
    in q's dtype, lse [B, H, T], natural log)."""
    B, H, T, d = q.shape
    ks = w1.shape[-1]
    h = ks // 2
    if ks % 2 == 0 or 4 * h >= BNW:
        raise ValueError(f"chain_schedule: odd kernel sizes with 4 (k // 2) < {BNW}, got {ks}")
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    rnd = (lambda x: x) if half is None else (lambda x: x.to(half).to(acc))
    rnd_p = (lambda x: x) if p_dtype is None else (lambda x: x.to(p_dtype).to(acc))
    w1, b1, w2, b2 = (x.to(acc) for x in (w1, b1, w2, b2))
    t1, k0, t2 = chain_tables(w1, b1, w2, b2, None if table is None else table.to(acc), T, H)
    W1, W2 = rnd(w1[:, :H, 0]), rnd(w2[:, :, 0])          # [D, H, k], [H, D, k]
    scale = 1.0 / math.sqrt(d)

    def tap_sum(Y):  # Y [C, k, rows, keys] -> sum_t Y_t[j + t - h], circular over the window
        return sum(torch.roll(Y[:, t], h - t, dims=-1) for t in range(ks))

    def gather(tab, dist):  # tab[:, dist + T - 1], 0 at |dist| >= T (the kernel's masked load)
        return torch.where(dist.abs() < T, tab[:, (dist + T - 1).clamp(0, 2 * T - 2)], 0.0)

    out = torch.zeros_like(q)
    lse = torch.zeros(B, H, T, dtype=acc)
    cols = torch.arange(BNW)
    inner = (cols >= 2 * h) & (cols < BNW - 2 * h)
    for b in range(B):
        for q0 in range(0, T, block_m):
            rows = q0 + torch.arange(block_m)
            r_ok = rows < T
            Q = q[b][:, rows.clamp(max=T - 1)].to(acc) * r_ok[:, None]
            m = torch.full((H, block_m), -1.0e30, dtype=acc)
            l = torch.zeros(H, block_m, dtype=acc)
            O = torch.zeros(H, block_m, d, dtype=acc)
            for ws in windows(q0, T, ks, block_m):
                keys = ws + cols
                k_ok = (keys >= 0) & (keys < T)
                K, V = (x[b][:, keys.clamp(0, T - 1)].to(acc) * k_ok[:, None] for x in (k, v))
                tril = (keys[None, :] <= rows[:, None]) & k_ok[None, :]
                # 1. the scores, once: conv1's input and the logits' S
                S = rnd(torch.where(tril, Q @ K.transpose(-1, -2) * scale, 0.0))   # [H, BM, BNW]
                dist = rows[:, None] - keys[None, :]
                t1v = gather(t1, dist)                                              # [D, BM, BNW]
                # 2. conv chain per row (all rows at once here: rows do not interact)
                y = tap_sum(torch.einsum("cht,hij->ctij", W1, S)) + t1v
                for j in range(k0.shape[0]):
                    if ws <= j < ws + BNW:   # the window holding key j < h
                        y[:, :, j - ws] -= k0[j][:, rows.clamp(max=T - 1)] * r_ok
                z = torch.where(k_ok, F.leaky_relu(y, 0.01), 0.0) - F.leaky_relu(t1v, 0.01)
                f = rnd(tap_sum(torch.einsum("hct,cij->htij", W2, rnd(z))))
                # 3. logits, online softmax, PV
                valid = tril & inner[None, :] & r_ok[:, None]
                # fused_l: L = S + f rounded, except at keys < 2h, where |f| is table-sized (the taps reach
                # keys < 0): the kernel keeps S aside there and sums in full precision, as here
                sf = torch.where(keys < 2 * h, S + f, rnd(S + f)) if fused_l else S + f
                lg = torch.where(valid, sf + gather(t2, dist), float("-inf"))
                m_new = torch.maximum(m, lg.amax(-1))
                alpha = torch.exp2((m - m_new) * math.log2(math.e))
                p = torch.exp2((lg - m_new[..., None]) * math.log2(math.e))
                l = l * alpha + p.sum(-1)
                O = O * alpha[..., None] + rnd_p(p) @ V
                m = m_new
            l = l.clamp_min(1e-30)
            out[b][:, rows[r_ok]] = (O / l[..., None])[:, r_ok].to(q.dtype)
            lse[b][:, rows[r_ok]] = (m + l.log())[:, r_ok]
    return out, lse


def ring_reads(H: int, ring: int, n_windows: int) -> list:
    """chain.py's K/V ring replayed on tile names for n_windows windows: the prologue's ring - 1 items,
    then per window item h + ring - 1 issued before step 1 reads K_h and item H + h + ring - 1 before
    step 3 reads V_h; item i of window w goes to slot i % ring and is K_i (i < H), V_(i - H) (i < 2 H) or
    the next window's K_(i - 2 H) (chain._issue). Returns (expected, found) per read: (window, "K" or
    "V", head) and what the slot holds; AssertionError where a copy would overwrite an unread tile or
    where the tile read may still be in flight after wait_group(ring - 1)."""
    slots = [None] * ring          # (tile, issue number, read yet)
    issued = 0

    def issue(w, i):
        nonlocal issued
        tile = (w, "K", i) if i < H else (w, "V", i - H) if i < 2 * H else (w + 1, "K", i - 2 * H)
        s = i % ring
        assert slots[s] is None or slots[s][2], f"item {i} of window {w} overwrites unread {slots[s][0]}"
        slots[s] = (tile, issued, False)
        issued += 1

    def read(expected, s):
        tile, n, _ = slots[s]
        assert issued - 1 - n <= ring - 1, f"{tile} may still be in flight when read"
        slots[s] = (tile, n, True)
        return expected, tile

    reads = []
    for i in range(ring - 1):
        issue(0, i)
    for w in range(n_windows):
        for h in range(H):
            issue(w, h + ring - 1)
            reads.append(read((w, "K", h), h % ring))
        for h in range(H):
            issue(w, H + h + ring - 1)
            reads.append(read((w, "V", h), (H + h) % ring))
    return reads
