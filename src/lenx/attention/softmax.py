"""The softmax normaliser: masked softmax over keys (the formula: lenx.ops.biased_softmax.reference)."""

import torch
from torch import nn

from ..ops.biased_softmax.reference import masked_softmax


class Softmax(nn.Module):
    name = "softmax"
    allowed_key = ("softmax",)  # what allowed() depends on beside the positions (decode steps share the mask)

    @classmethod
    def from_config(cls, ctx):
        return cls()

    def forward(self, scores, v, allowed, post=None):
        """scores [B, H, Tq, Tk], allowed broadcastable to them -> (out [B, H, Tq, d], None); post maps
        the probabilities before they weight v (MTA's head mixing after the softmax)."""
        return masked_softmax(scores, v, allowed, post), None

    def allowed(self, q_pos, k_pos, causal: bool):
        """[Tq, Tk], or [B, Tq, Tk] for positions per sequence ([B, Tq], [B, Tk])."""
        if not causal:
            return torch.ones(*q_pos.shape, k_pos.shape[-1], dtype=torch.bool, device=q_pos.device)
        return k_pos[..., None, :] <= q_pos[..., :, None]

    def finish(self, out, rem, v):
        return out
