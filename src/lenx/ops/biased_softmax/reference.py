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
    """softmax(scores) v over the allowed keys: scores [..., Tq, Tk], allowed [Tq, Tk] (or broadcasting to
    scores) -> [..., Tq, d].
    post, if given, maps the probabilities before they weight v."""
    acc = torch.float64 if scores.dtype == torch.float64 else torch.float32
    # masked before it is widened: the same values, the fill (and its backward) in the scores' dtype;
    # a where, not a masked_fill: that one clones the map and fills the clone (two passes on a GPU)
    probs = torch.where(allowed, scores, float("-inf")).to(acc).softmax(-1)
    if post is not None:
        probs = post(probs)
    return torch.matmul(probs.to(v.dtype), v)


def biased_softmax_reference(q, k, v, table=None, window: int = 0, segments=None):
    """Causal softmax attention of q, k, v [B, H, T, d] (scale 1/sqrt(d)) plus table's bias. window > 0:
    row i sees keys i - window < j <= i only; segments [B, T] document ids: no row sees another
    document's key."""
    T = q.shape[-2]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    pos = torch.arange(T, device=q.device)
    scores = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if table is not None:
        scores = scores + table_bias(table, pos, pos).to(acc)
    return masked_softmax(scores, v.to(acc), visible(pos, window, segments)).to(v.dtype)


def visible(pos, window: int = 0, segments=None) -> torch.Tensor:
    """[T, T] (with segments [B, 1, T, T]) mask of the keys row i sees: j <= i, with a window i - j < window,
    with document ids [B, T] only its own document's."""
    allowed = pos[None, :] <= pos[:, None]
    if window:
        allowed = allowed & (pos[:, None] - pos[None, :] < window)
    if segments is not None:
        allowed = allowed & (segments[:, None, :, None] == segments[:, None, None, :])
    return allowed
