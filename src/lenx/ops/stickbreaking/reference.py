"""Stick-breaking attention (Tan et al. 2024), dense and written straight from the formula.

beta_ij = sigmoid(z_ij) for allowed keys (j < i, or j <= i with attend_current);
A_ij = beta_ij * prod_{j<l<=i, l allowed} (1 - beta_il). In log space, with log(1 - sigmoid(z)) =
-softplus(z): log A_ij = logsigmoid(z_ij) - sum_{l>j, allowed} softplus(z_il), accumulated in fp32.
rem_i = 1 - sum_j A_ij = prod_j (1 - beta_ij) = exp(-sum_j softplus(z_ij)).
"""

import math

import torch
from torch.nn import functional as F


def stickbreaking_allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, attend_current: bool) -> torch.Tensor:
    """[Tq, Tk] mask of the keys each query may take a share of the stick from ([B, Tq, Tk] for
    positions per sequence, [B, Tq] and [B, Tk])."""
    if attend_current:
        return k_pos[..., None, :] <= q_pos[..., :, None]
    return k_pos[..., None, :] < q_pos[..., :, None]


def stickbreaking_weights(logits: torch.Tensor, allowed: torch.Tensor):
    """logits [..., Tq, Tk], allowed [Tq, Tk] -> (A [..., Tq, Tk] fp32, rem [..., Tq] fp32)."""
    z = logits.double() if logits.dtype == torch.float64 else logits.float()  # at least fp32
    sp = F.softplus(z).masked_fill(~allowed, 0.0)
    # Strict suffix sums: sum over l > j of softplus(z_il). The total is the prefix sums' last entry,
    # not a separate sum: inductor (torch 2.11, CUDA) fails to fuse a split sum with the scan.
    prefix = sp.cumsum(-1)
    total = prefix[..., -1:]
    suffix = total - prefix
    log_a = (F.logsigmoid(z) - suffix).masked_fill(~allowed, -math.inf)
    return log_a.exp(), torch.exp(-total.squeeze(-1))


def stickbreaking_reference(q, k, v, attend_current: bool = False, window: int = 0, segments=None):
    """Dense stick-breaking attention, q, k, v [B, H, T, d], scale 1/sqrt(d) -> (out, rem). window > 0:
    query i sees keys i - window < j only; segments [B, T]: no query sees a key of another document.
    A key masked so is exactly a key past the causal edge: it takes no share and breaks no stick."""
    T = q.shape[-2]
    pos = torch.arange(T, device=q.device)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    logits = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    allowed = stickbreaking_allowed(pos, pos, attend_current)
    if window:
        allowed = allowed & (pos[:, None] - pos[None, :] < window)
    if segments is not None:
        allowed = allowed & (segments[:, None, :, None] == segments[:, None, None, :])
    A, rem = stickbreaking_weights(logits, allowed)
    return torch.matmul(A, v.to(acc)).to(v.dtype), rem
