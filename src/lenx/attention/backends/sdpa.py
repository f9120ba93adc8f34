"""Fused torch scaled_dot_product_attention: softmax with no bias and no processor; a window or
document mask goes in as a boolean mask (O(T^2) bytes: FlexAttention's block mask skips the
blocks outside it instead)."""

import torch
from torch.nn import functional as F

from ..masks import visible
from .base import Backend, LayerMemory


class Sdpa(Backend):
    name = "sdpa"

    def unsupported(self, parts, device):
        if parts.bias is not None or parts.processor is not None or parts.normaliser.name != "softmax":
            return "fused SDPA takes only plain softmax attention (no bias, no score processor)"
        return None

    def memory(self, parts, work):
        own = super().memory(parts, work)
        if not parts.masked:
            return own
        mask = work.length ** 2 * (work.batch if parts.segments else 1)  # one byte an entry
        return LayerMemory(own.kept + (mask if work.training else 0), own.peak + mask)

    def run(self, q, k, v, parts, chunk_size=256, segments=None):
        if not parts.masked:
            return F.scaled_dot_product_attention(q, k, v, is_causal=parts.causal), None
        T = q.shape[-2]
        pos = torch.arange(T, device=q.device)
        allowed = visible(pos, pos, parts.window, segments, segments)
        if parts.causal:
            allowed = allowed & (pos[None, :] <= pos[:, None])
        if allowed.dim() == 3:
            allowed = allowed[:, None]  # [B, 1, T, T]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed), None
