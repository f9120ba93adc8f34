"""Forgetting attention (FoX; Lin et al., ICLR 2025, arXiv 2503.02130), dense and written straight
from the formula:

    out = softmax_causal(Q K^T / sqrt(d) + c_i - c_j) V

c [B, H, T] holds each head's prefix sums of log forget gates (c_t = sum_{l <= t} log f_l), so
c_i - c_j is the sum of log f over positions j + 1 .. i. Accumulated in fp32 (fp64 inputs stay
fp64); the gradient to c is autograd's."""

import math

import torch

from ..biased_softmax.reference import masked_softmax, visible


def forgetting_reference(q, k, v, c, window: int = 0, segments=None):
    """Causal softmax attention of q, k, v [B, H, T, d] (scale 1/sqrt(d)) plus the bias c_i - c_j; window
    and segments [B, T] mask keys as in biased_softmax_reference."""
    T = q.shape[-2]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    pos = torch.arange(T, device=q.device)
    c = c.to(acc)
    scores = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores + c[..., :, None] - c[..., None, :]
    return masked_softmax(scores, v.to(acc), visible(pos, window, segments)).to(v.dtype)
