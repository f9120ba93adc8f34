"""Fused forgetting attention (FoX): the biased-softmax kernels (lenx.ops.biased_softmax.triton) with
their bias read from c instead of a per-distance band. Each [BM, BN] bias tile is c_i - c_j from two
vector loads (the rows' c and the keys' c, pre-scaled by log2(e), both less c at the query block's
first row, or the key block's in the key-owner kernel, so that the entries that weigh keep fp32's
precision where c is in the thousands); no [H, 2T - 1] table and no band.

Backward: dS = P (dP - Delta) as for any bias. The gradient of c_j is -sum_i dS_ij, summed by the
key-owner kernel over its query tiles (one owner per key block: no atomics). That of c_i, the row
sum sum_j dS_ij, is zero under softmax (sum_j P_ij dP_ij = Delta_i) and is left out: the tests hold
the kernel's dc to the float64 reference's, which has both terms. The gradient to log f is torch's
cumsum backward (a reverse cumsum), outside the kernel."""

import torch

from .._launch import check_masks, check_qkv
from ..biased_softmax.triton import BiasedAttention, row_factor, tile_config


def forgetting_attention(q, k, v, c, config: dict | None = None, window: int = 0, segments=None, q_scale=None):
    """Causal softmax attention of q, k, v [B, H, T, d] with FoX's bias c_i - c_j, c [B, H, T] (fp32;
    see reference.py). Differentiable in all four. config: tile settings over the biased-softmax
    defaults (lenx.ops.biased_softmax.band.CONFIG; the band settings do not apply). window,
    segments [B, T]: masks as biased_attention's; q_scale: a factor per query row, as biased_attention's."""
    check_qkv(q, k, v)
    if tuple(c.shape) != tuple(q.shape[:3]) or c.dtype != torch.float32:
        raise ValueError(f"c must be fp32 [B, H, T] = {list(q.shape[:3])}, got {c.dtype} {list(c.shape)}")
    window, spans = check_masks(window, segments, q.shape[0], q.shape[2], q.device)
    return BiasedAttention.apply(q, k, v, None, c, None, None, None, None, tile_config(q.dtype, q.shape[-1], config),
                                 window, spans, None, row_factor(q_scale, *q.shape[:3], q.device))
