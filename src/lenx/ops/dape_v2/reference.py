"""DAPE V2 (arXiv 2410.04798), dense and written straight from the formula:

    A = S + Bias + f(tril([S; Bias])),   out = softmax_causal(A) V,   S = Q K^T / sqrt(d)
    f = conv2(leaky_relu(conv1(.), 0.01)), both convs (1, k) along keys with zero padding k // 2

conv1 maps C = 2H channels (scores and bias of every head; H without a bias) to D, conv2 maps D
back to H. The kernel has height 1, so each query row is processed on its own; tril zeroes the
inputs at keys after the row's own position (so no output sees a future key). k = 1 is DAPE (v1).
"""

import math

import torch
from torch.nn import functional as F

from ..biased_softmax.reference import masked_softmax, table_bias


def dape_v2_scores(scores, bias, w1, b1, w2, b2, q_pos=None, k_pos=None, leak: bool = False):
    """S + Bias + f(tril([S; Bias])) for scores [B, H, Tq, Tk] (scaled) and bias broadcastable to
    them (or None: then conv1 takes H channels). q_pos, k_pos: the rows' and keys' positions
    (default: the rows are the last Tq of Tk positions). leak=True drops the tril (the paper's
    information-leakage experiment only). No -inf masking."""
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
            q_pos = k_pos[Tk - Tq:]
        x = x.masked_fill(k_pos[None, :] > q_pos[:, None], 0.0)
    pad = (0, w1.shape[-1] // 2)
    f = F.conv2d(F.leaky_relu(F.conv2d(x, w1, b1, padding=pad), 0.01), w2, b2, padding=pad)
    out = scores + f.to(scores.dtype)
    return out if bias is None else out + bias


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
