"""DAPE V2 (arXiv 2410.04798), dense and written straight from the formula:

    A = S + Bias + f(tril([S; Bias])),   out = softmax_causal(A) V,   S = Q K^T / sqrt(d)
    f = conv2(leaky_relu(conv1(.), 0.01)), both convs (1, k) along keys with zero padding k // 2

conv1 maps C = 2H channels (scores and bias of every head; H without a bias) to D, conv2 maps D
back to H. The kernel has height 1, so each query row is processed on its own; tril zeroes the
inputs at keys after the row's own position (so no output sees a future key). k = 1 is DAPE (v1).

Rewrite A (dape_v2_tables, dape_v2_scores_tabled): with a per-distance bias, tril(Bias) depends only on
i - j, so conv1 over the bias channels is a per-distance table t1[c, i - j] (b1 folded in), and Bias + b2
a table t2[h, i - j]. Distance invariance breaks only at the zero padding left of key 0: keys j < k // 2
read padding, which the table counts as bias, so k0[j, c, i] takes it back out. conv1 then has only the
H score channels as input.
"""

import math
from contextlib import contextmanager

import torch
from torch.nn import functional as F

from ..biased_softmax.reference import masked_softmax, table_bias


def dape_v2_scores(scores, bias, w1, b1, w2, b2, q_pos=None, k_pos=None, leak: bool = False, key_valid=None,
                   visible=None):
    """S + Bias + f(tril([S; Bias])) for scores [B, H, Tq, Tk] (scaled) and bias broadcastable to
    them (or None: then conv1 takes H channels). q_pos, k_pos: the rows' and keys' positions, [Tq]
    and [Tk] or per sequence [B, Tq] and [B, Tk] (default: the rows are the last Tq of Tk
    positions). leak=True drops the tril (the paper's information-leakage experiment only).
    key_valid [B, Tk] or per row [B, Tq, Tk] (default: all): the keys that exist; the others (a
    left-padded batch's padding, a fixed-size cache's empty slots, another document's keys) read as
    the zero padding past the sequence's ends, both as conv1's input and as conv2's, so a row's
    scores are those of its sequence (its document) alone.
    visible [Tq, Tk] or [B, Tq, Tk] (default: all): keys a mask hides from the row (a window, another
    document) read as keys past the diagonal do, zeros as conv1's input. No -inf masking."""
    if bias is not None:
        bias = bias.to(scores.dtype).expand_as(scores)
        x = torch.cat([scores, bias], dim=1)
    else:
        x = scores
    if not leak:
        Tq, Tk = scores.shape[-2:]
        if k_pos is None:
            k_pos = torch.arange(Tk, device=scores.device)
        if q_pos is None:
            q_pos = k_pos[..., Tk - Tq:]
        x = x.masked_fill((k_pos[..., None, :] > q_pos[..., :, None]).unsqueeze(-3), 0.0)
    if visible is not None:
        x = x.masked_fill(~visible.unsqueeze(-3), 0.0)
    absent = None if key_valid is None else ~(key_valid[:, None] if key_valid.dim() == 3 else key_valid[:, None, None])
    if absent is not None:
        x = x.masked_fill(absent, 0.0)
    pad = (0, w1.shape[-1] // 2)
    with full_fp32_convs():
        hidden = F.leaky_relu(F.conv2d(x, w1, b1, padding=pad), 0.01)
        if absent is not None:
            hidden = hidden.masked_fill(absent, 0.0)
        f = F.conv2d(hidden, w2, b2, padding=pad)
    out = scores + f.to(scores.dtype)
    return out if bias is None else out + bias


@contextmanager
def full_fp32_convs():
    """cuDNN runs fp32 convolutions in TF32 by default (torch.backends.cudnn.allow_tf32, Ampere and
    later): 10 mantissa bits. conv1 reads the bias channels, ~1e6 with Kerple-power at T 2048, so
    TF32 costs it errors of hundreds, and the dense path's output was 0.17 relative off float64 on an
    H200; 1.7e-4 in full fp32: notes/kernels.md). The formula's convolutions run in
    full fp32; the flag is restored after."""
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = old


def dape_v2_reference(q, k, v, w1, b1, w2, b2, table=None):
    """Causal DAPE V2 attention of q, k, v [B, H, T, d], with a per-distance bias table [H, 2T - 1]
    (entry (i - j) + T - 1) or none. Accumulated in fp32 (fp64 inputs stay fp64)."""
    T = q.shape[-2]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    pos = torch.arange(T, device=q.device)
    scores = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    bias = table_bias(table, pos, pos).to(acc) if table is not None else None
    w1, b1, w2, b2 = (w.to(acc) for w in (w1, b1, w2, b2))
    A = dape_v2_scores(scores, bias, w1, b1, w2, b2, pos, pos)
    return masked_softmax(A, v.to(acc), pos[None, :] <= pos[:, None]).to(v.dtype)


def dape_v2_tables(w1, b1, b2, table, T: int):
    """Rewrite A's tables from the conv weights w1 [D, 2H, 1, k], b1 [D], b2 [H] and the bias table
    [H, 2T - 1] (entry (i - j) + T - 1). Returns (t1 [D, 2T - 1], k0 [k // 2, D, T], t2 [H, 2T - 1]),
    indexed like the bias table; differentiable in all inputs:

        t1[c, n] = b1[c] + sum_{h, t} w1[c, H + h, t] Bias_h(n - t + k//2)   (0 at negative distances)
        k0[j, c, i] = the part of t1[c, i - j] that key j < k // 2 reads from the padding left of key 0
        t2[h, n] = Bias_h(n) + b2[h]
    """
    H = table.shape[0]
    ks = w1.shape[-1]
    half = ks // 2
    # P[t, c, m]: tap t's contribution from a bias entry at distance m = 0..T-1 (tril keeps only m >= 0)
    P = torch.einsum("cht,hm->tcm", w1[:, H:, 0, :], table[:, T - 1:])
    # index m + T - 1 + half over distances -(T - 1) - half .. T - 1 + half, zero outside 0..T-1
    Pp = F.pad(P, (T - 1 + half, half))
    t1 = b1[:, None] + sum(Pp[t, :, 2 * half - t: 2 * half - t + 2 * T - 1] for t in range(ks))
    k0 = torch.stack([sum(Pp[t, :, T - 1 + 2 * half - j - t: 2 * T - 1 + 2 * half - j - t] for t in range(half - j))
                      for j in range(half)]) if half else t1.new_zeros(0, w1.shape[0], T)
    return t1, k0, table + b2[:, None]


def residual_table(t1, w2):
    """g [H, 2T - 1] (entry (i - j) + T - 1): conv2 of the hidden map's table part,

        g[h, n] = sum_{t, c} w2[h, c, 0, t] leaky_relu(t1[c, n - t + k // 2], 0.01)   (t1 = 0 beyond |n| < T)

    The fused kernels feed conv2 the residual z - leaky_relu(t1[c, i - u]) at every key u (keys
    outside [0, T) included, where z = 0; t1 read as 0 at |i - u| >= T), so their f is f - g[i - j]
    exactly, and g goes into t2 (fp32). With a large bias table (ALiBi: |t1| ~ slope x T) z and f are
    in the hundreds, and fp16 or bf16 would cost logit errors of 0.1-1; the residuals are bounded by
    conv1 of the scores (|leaky(a + b) - leaky(b)| <= |a|). fp32 also under autocast."""
    h = w2.shape[-1] // 2
    n = t1.shape[1]
    with torch.autocast(t1.device.type, enabled=False):
        lt = F.pad(F.leaky_relu(t1.float(), 0.01), (h, h))  # leaky(0) = 0: padding after the LeakyReLU is the same
        return sum(torch.einsum("hc,cn->hn", w2[:, :, 0, t].float(), lt[:, 2 * h - t: 2 * h - t + n])
                   for t in range(w2.shape[-1]))


def dape_v2_scores_tabled(scores, w1, t1, k0, w2, t2, q_pos, k_pos):
    """dape_v2_scores with a per-distance bias, through rewrite A: scores [B, H, Tq, Tk] (scaled), the
    score channels' conv1 weights w1 [D, H, 1, k], the tables of dape_v2_tables, conv2's weight w2
    (its bias is in t2). Equal to dape_v2_scores(scores, table_bias(table, q_pos, k_pos), ...) at every
    entry on or below the diagonal (the causal ones); k_pos must start at 0 or beyond k // 2."""
    half = w1.shape[-1] // 2
    x = scores.masked_fill(k_pos[None, :] > q_pos[:, None], 0.0)
    y = F.conv2d(x, w1, None, padding=(0, half)) + table_bias(t1, q_pos, k_pos).to(x.dtype)
    for j in range(half):
        at_j = (k_pos == j).to(x.dtype)  # the key at position j, if this block holds it
        y = y - k0[j][:, q_pos, None].to(x.dtype) * at_j
    f = F.conv2d(F.leaky_relu(y, 0.01), w2, None, padding=(0, half))
    return scores + f + table_bias(t2, q_pos, k_pos).to(scores.dtype)
