"""The stick-breaking normaliser (Tan et al. 2024) with its remainder handling."""

import torch
from torch import nn

from ..ops.stickbreaking.reference import stickbreaking_allowed, stickbreaking_weights

REMAINDER_MODES = ("value", "head", "drop")


class StickBreaking(nn.Module):
    """remainder: what to do with rem_i = 1 - sum_j A_ij, the stick left over:
    "value" adds rem_i * v_i (the authors' tests and default config), "head" adds rem_i * r_h with a
    learned per-head vector r (zero init) and then GroupNorm over heads, "drop" ignores it."""

    name = "stickbreaking"

    def __init__(self, num_heads: int, head_dim: int, attend_current: bool = False, remainder: str = "value"):
        super().__init__()
        if remainder not in REMAINDER_MODES:
            raise ValueError(f"unknown stick-breaking remainder {remainder!r}; choose one of {', '.join(REMAINDER_MODES)}")
        self.attend_current, self.remainder = attend_current, remainder
        if remainder == "head":
            self.rem_vector = nn.Parameter(torch.zeros(num_heads, head_dim))
            self.norm = nn.GroupNorm(num_heads, num_heads * head_dim)

    @classmethod
    def from_config(cls, ctx):
        return cls(ctx.n_head, ctx.head_dim, ctx.cfg.sb_attend_current, ctx.cfg.sb_remainder)

    @property
    def allowed_key(self) -> tuple:
        """What allowed() depends on beside the positions (the layers of a decode step share the mask)."""
        return ("stickbreaking", self.attend_current)

    def allowed(self, q_pos, k_pos, causal: bool):
        if not causal:
            raise ValueError("stick-breaking attention is directional and cannot run non-causally")
        return stickbreaking_allowed(q_pos, k_pos, self.attend_current)

    def forward(self, scores, v, allowed):
        A, rem = stickbreaking_weights(scores, allowed)
        return torch.matmul(A.to(v.dtype), v), rem

    def finish(self, out, rem, v):
        """out [B, H, T, d], rem [B, H, T], v [B, H, T, d] (values at the query positions)."""
        if self.remainder == "value":
            return out + rem.unsqueeze(-1).to(out.dtype) * v
        if self.remainder == "head":
            out = out + rem.unsqueeze(-1).to(out.dtype) * self.rem_vector[None, :, None, :].to(out.dtype)
            B, H, T, d = out.shape
            flat = out.transpose(1, 2).reshape(B * T, H * d)
            return self.norm(flat).view(B, T, H, d).transpose(1, 2)
        return out
