"""RoPE (Su et al. 2021): rotate query and key pairs by a position-dependent angle."""

import torch
from torch import nn


class RoPE(nn.Module):
    """Rotate-half layout, all of the head dimension rotated, base 10000 by default."""

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @classmethod
    def from_config(cls, ctx):
        return cls(ctx.head_dim, ctx.cfg.rope_base)

    def rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        angles = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [T, d/2]
        cos = torch.cat([angles.cos(), angles.cos()], -1).to(x.dtype)
        sin = torch.cat([angles.sin(), angles.sin()], -1).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def forward(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor):
        return self.rotate(q, pos), self.rotate(k, pos)
