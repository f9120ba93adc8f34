"""Fused torch scaled_dot_product_attention: softmax with no bias and no processor."""

from torch.nn import functional as F

from .base import Backend


class Sdpa(Backend):
    name = "sdpa"

    def unsupported(self, parts, device):
        if parts.bias is not None or parts.processor is not None or parts.normaliser.name != "softmax":
            return "fused SDPA takes only plain softmax attention (no bias, no score processor)"
        return None

    def run(self, q, k, v, parts, chunk_size=256):
        return F.scaled_dot_product_attention(q, k, v, is_causal=parts.causal), None
