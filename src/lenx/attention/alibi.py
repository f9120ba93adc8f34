"""ALiBi (Press et al. 2022): Bias = -m_h * (i - j), fixed geometric slopes."""

import math

import torch

from .positions import DistanceBias


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Slopes m_h. For H a power of two: 2^(-8h/H), h = 1..H. Otherwise the slopes of the
    largest power of two P < H, then every other slope of the 2P set until H slopes."""

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    if num_heads & (num_heads - 1) == 0:
        slopes = power_of_two(num_heads)
    else:
        p = 2 ** math.floor(math.log2(num_heads))
        slopes = power_of_two(p) + power_of_two(2 * p)[0::2][: num_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBi(DistanceBias):
    def __init__(self, num_heads: int, causal: bool = True):
        super().__init__()
        self.causal = causal
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    @classmethod
    def from_config(cls, ctx):
        return cls(ctx.n_head, ctx.cfg.causal)

    @property
    def distance_dtype(self) -> torch.dtype:
        return self.slopes.dtype

    def from_distance(self, dist: torch.Tensor) -> torch.Tensor:
        return -self.slopes.view(-1, *([1] * dist.dim())) * dist.to(self.slopes.dtype)
