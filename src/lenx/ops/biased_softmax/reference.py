"""Softmax attention with a per-distance bias table, dense and written straight from the formula:

    out = softmax_causal(Q K^T / sqrt(d) + table[h, i - j + T - 1]) V

The table [H, 2T - 1] holds the bias of every signed distance i - j (entry (i - j) + T - 1), as
ALiBi, Kerple and T5 give it; no table is plain causal softmax. Accumulated in fp32 (fp64 inputs
stay fp64)."""

import math

import torch


def table_bias(table: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """The [H, Tq, Tk] bias of queries at q_pos and keys at k_pos, read from a [H, 2T - 1] table."""
    T = (table.shape[-1] + 1) // 2
    return table[:, q_pos[:, None] - k_pos[None, :] + T - 1]


def masked_softmax(scores: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, post=None) -> torch.Tensor:
    """softmax(scores) v over the allowed keys: scores [..., Tq, Tk], allowed [Tq, Tk] -> [..., Tq, d].
    post, if given, maps the probabilities before they weight v."""
    acc = torch.float64 if scores.dtype == torch.float64 else torch.float32
    probs = scores.to(acc).masked_fill(~allowed, float("-inf")).softmax(-1)
    if post is not None:
        probs = post(probs)
    return torch.matmul(probs.to(v.dtype), v)


def biased_softmax_reference(q, k, v, table=None):
    """Causal softmax attention of q, k, v [B, H, T, d] (scale 1/sqrt(d)) plus table's bias."""
    T = q.shape[-2]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    pos = torch.arange(T, device=q.device)
    scores = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if table is not None:
        scores = scores + table_bias(table, pos, pos).to(acc)
    return masked_softmax(scores, v.to(acc), pos[None, :] <= pos[:, None]).to(v.dtype)
