"""T5 relative bias (Raffel et al. 2020): a learned scalar per (bucket, head), shared by all layers."""

import math

import torch
from torch import nn

from .positions import DistanceBias, signed_distances


def t5_bucket(n: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Bucket of a non-negative distance n: exact below num_buckets // 2, log-spaced up to
    max_distance, capped at num_buckets - 1."""
    exact = num_buckets // 2
    n = n.clamp(min=0)
    log_part = exact + (
        torch.log(n.clamp(min=1).to(torch.float32) / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    ).floor().long()
    return torch.where(n < exact, n, log_part.clamp(max=num_buckets - 1))


class T5Bias(DistanceBias):
    """Causal: 32 buckets of max(i - j, 0) up to distance 128. Bidirectional (encoders): half the
    buckets for each direction, as in T5's encoder."""

    def __init__(self, num_heads: int, causal: bool = True, num_buckets: int = 32, max_distance: int = 128):
        super().__init__()
        self.causal, self.num_buckets, self.max_distance = causal, num_buckets, max_distance
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)
        # causal: the smallest distance in the last bucket (the table is constant from there on)
        n = torch.arange(4 * max_distance, device="cpu")  # a plain number, also when built on meta
        self.tail_start = int((t5_bucket(n, num_buckets, max_distance) < num_buckets - 1).sum()) if causal else None

    @classmethod
    def from_config(cls, ctx):
        # One table for the whole model: the first layer creates it, the others reuse it.
        if "t5" not in ctx.shared:
            ctx.shared["t5"] = cls(ctx.n_head, ctx.cfg.causal, ctx.cfg.t5_buckets, ctx.cfg.t5_max_distance)
        return ctx.shared["t5"]

    def bucket(self, signed_dist: torch.Tensor) -> torch.Tensor:
        if self.causal:
            return t5_bucket(signed_dist, self.num_buckets, self.max_distance)
        half = self.num_buckets // 2
        return (signed_dist < 0).long() * half + t5_bucket(signed_dist.abs(), half, self.max_distance)

    def fused_grad_args(self) -> dict:
        # the last bucket's distances reach one parameter per head: only their gradient's sum matters
        return {"tail": self.tail_start} if self.causal else {}

    def from_distance(self, dist: torch.Tensor) -> torch.Tensor:
        """dist = i - j (signed for bidirectional use)."""
        return self.relative_attention_bias(self.bucket(dist)).movedim(-1, 0)

    def table(self, T: int, device=None) -> torch.Tensor:
        return self.from_distance(signed_distances(T, device))  # buckets take the signed distance

    def distance(self, q_pos, k_pos) -> torch.Tensor:
        """The signed distance i - j ([Tq, Tk], or [B, Tq, Tk] per sequence): buckets take its sign."""
        return q_pos[..., :, None] - k_pos[..., None, :]
