"""Transformer-XL relative encoding (Dai et al. 2019).

logit_ij = (q_i + u) . k_j + (q_i + v) . W_R R_{i-j}; the content term q_i . k_j is the ordinary
score, so this part contributes u . k_j + (q_i + v) . W_R R_{i-j}, scaled like the scores.
"""

import math

import torch
from torch import nn

from .parts import ScoreBias


def sinusoid(dist: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding R of (signed) distances: [N] -> [N, dim]."""
    inv_freq = 10000 ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=dist.device) / dim)
    angles = dist.to(torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.sin(), angles.cos()], -1)


class XLRelative(ScoreBias):
    def __init__(self, num_heads: int, head_dim: int, d_model: int, causal: bool = True):
        super().__init__()
        self.causal, self.num_heads, self.head_dim, self.d_model = causal, num_heads, head_dim, d_model
        self.u = nn.Parameter(torch.randn(num_heads, head_dim) * 0.02)
        self.v = nn.Parameter(torch.randn(num_heads, head_dim) * 0.02)
        self.W_R = nn.Linear(d_model, num_heads * head_dim, bias=False)

    @classmethod
    def from_config(cls, ctx):
        return cls(ctx.n_head, ctx.head_dim, ctx.d_model, ctx.cfg.causal)

    def forward(self, q_pos, k_pos, q=None, k=None):
        """[B, H, Tq, Tk] for positions q_pos [Tq], k_pos [Tk], or per sequence [B, Tq], [B, Tk]."""
        if q is None or k is None:
            raise ValueError("the Transformer-XL bias needs q and k")
        dist = q_pos[..., :, None] - k_pos[..., None, :]  # [Tq, Tk] or [B, Tq, Tk], signed
        if self.causal:
            # The rows lie among the keys (as every caller has them: a query attends keys up to its
            # own position), so i - j <= Tk - 1: a range fixed by the shapes, read with no host sync
            # (the decode step runs inside a CUDA graph).
            lo, hi = 0, k_pos.shape[-1] - 1
            dist = dist.clamp(lo, hi)
        else:
            lo, hi = int(dist.min()), int(dist.max())
        # Project each distinct distance once, then gather: O((Tq + Tk) H d) instead of O(Tq Tk H d).
        R = sinusoid(torch.arange(lo, hi + 1, device=q.device), self.d_model)
        P = self.W_R(R.to(self.W_R.weight.dtype)).view(-1, self.num_heads, self.head_dim)  # [N, H, d]
        pos_term = torch.einsum("bhqd,nhd->bhqn", q + self.v[:, None, :].to(q.dtype), P.to(q.dtype))
        index = (dist - lo).unsqueeze(-3).expand(q.shape[0], self.num_heads, -1, -1)
        pos_term = torch.gather(pos_term, -1, index)  # [B, H, Tq, Tk]
        content_term = torch.einsum("hd,bhkd->bhk", self.u.to(k.dtype), k)[:, :, None, :]
        return (pos_term + content_term) / math.sqrt(self.head_dim)
