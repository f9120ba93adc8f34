"""The softmax normaliser: masked softmax over keys."""

import torch
from torch import nn


class Softmax(nn.Module):
    name = "softmax"

    def forward(self, scores, v, allowed):
        """scores [B, H, Tq, Tk], allowed [Tq, Tk] -> (out [B, H, Tq, d], None)."""
        acc = torch.float64 if scores.dtype == torch.float64 else torch.float32
        probs = scores.to(acc).masked_fill(~allowed, float("-inf")).softmax(-1)
        return torch.matmul(probs.to(v.dtype), v), None

    def allowed(self, q_pos, k_pos, causal: bool):
        if not causal:
            return torch.ones(len(q_pos), len(k_pos), dtype=torch.bool, device=q_pos.device)
        return k_pos[None, :] <= q_pos[:, None]

    def finish(self, out, rem, v):
        return out
