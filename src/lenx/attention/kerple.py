"""Kerple (Chi et al. 2022): kernelised relative biases, log and power variants."""

import torch
from torch import nn

from .positions import DistanceBias


class KerpleLog(DistanceBias):
    """Bias = -r1 * log(1 + r2 * |i - j|), r1 ~ U(0,2), r2 ~ U(0,1), both clamped >= 1e-2."""

    def __init__(self, num_heads: int, causal: bool = True, eps: float = 1e-2):
        super().__init__()
        self.causal, self.eps = causal, eps
        self.r1 = nn.Parameter(torch.rand(num_heads) * 2)
        self.r2 = nn.Parameter(torch.rand(num_heads))

    @classmethod
    def from_config(cls, ctx):
        return cls(ctx.n_head, ctx.cfg.causal)

    def clamped(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(r1, r2) as used, [H] each."""
        return self.r1.clamp(min=self.eps), self.r2.clamp(min=self.eps)

    def fused_grad_args(self) -> dict:
        return {"kerple": ("log", *self.clamped())} if self.causal else {}

    @property
    def distance_dtype(self) -> torch.dtype:
        return self.r1.dtype

    def from_distance(self, dist: torch.Tensor) -> torch.Tensor:
        shape = (-1,) + (1,) * dist.dim()
        r1, r2 = (x.view(shape) for x in self.clamped())
        return -r1 * torch.log1p(r2 * dist.to(r1.dtype))


class KerplePower(DistanceBias):
    """Bias = -a * |i - j|^p, a ~ U(0,1) clamped >= 1e-2, p ~ U(0,2) clamped to [1e-2, 2]."""

    def __init__(self, num_heads: int, causal: bool = True, eps: float = 1e-2):
        super().__init__()
        self.causal, self.eps = causal, eps
        self.a = nn.Parameter(torch.rand(num_heads))
        self.p = nn.Parameter(torch.rand(num_heads) * 2)

    @classmethod
    def from_config(cls, ctx):
        return cls(ctx.n_head, ctx.cfg.causal)

    def clamped(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, p) as used, [H] each."""
        return self.a.clamp(min=self.eps), self.p.clamp(self.eps, 2.0)

    def fused_grad_args(self) -> dict:
        return {"kerple": ("power", *self.clamped())} if self.causal else {}

    @property
    def distance_dtype(self) -> torch.dtype:
        return self.a.dtype

    def from_distance(self, dist: torch.Tensor) -> torch.Tensor:
        shape = (-1,) + (1,) * dist.dim()
        a, p = (x.view(shape) for x in self.clamped())
        d = dist.to(a.dtype)
        # d**p at d = 0 has a NaN gradient in p (0 * log 0); evaluate at 1 and zero it instead.
        powered = torch.where(d > 0, d.clamp(min=1.0) ** p, torch.zeros_like(d))
        return -a * powered
