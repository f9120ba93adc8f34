"""RoPE (Su et al. 2021): rotate query and key pairs by a position-dependent angle, with the context
extensions practitioners apply to a RoPE model beyond its training length.

With theta_i = base^(-2i/d) (i = 0 .. d/2 - 1), a scale s and the training length L_train:
  none         angles m theta_i
  pi           Position Interpolation (Chen et al. 2023): angles (m / s) theta_i
  ntk          NTK-aware: base' = base s^(d / (d - 2))
  dynamic-ntk  NTK-aware with s = max(1, L / L_train) from the current length L
  yarn         YaRN (Peng et al. 2023), as its authors' code computes it: for b rotations over L_train,
               c(b) = d ln(L_train / (2 pi b)) / (2 ln base); low = floor(c(beta_fast)),
               high = ceil(c(beta_slow)), clamped to [0, d - 1]; ramp(i) = clamp((i - low) / (high - low),
               0, 1); theta'_i = theta_i / s ramp(i) + theta_i (1 - ramp(i)); and cos, sin (so q and k)
               times 0.1 ln s + 1 (1 when s <= 1), the attention temperature.
factor <= 0 means "auto": s = max(1, L / L_train) for the length L being processed, so within the
training length every method is the identity.
"""

import math

import torch
from torch import nn

SCALINGS = ("none", "pi", "ntk", "dynamic-ntk", "yarn")


class RoPE(nn.Module):
    """Rotate-half layout, all of the head dimension rotated, base 10000 by default."""

    def __init__(self, head_dim: int, base: float = 10000.0, scaling: str = "none", factor: float = 0.0,
                 train_len: int = 0, beta_fast: float = 32.0, beta_slow: float = 1.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        if scaling not in SCALINGS:
            raise ValueError(f"unknown RoPE scaling {scaling!r}; choose one of {', '.join(SCALINGS)}")
        if scaling != "none" and train_len < 1:
            raise ValueError(f"RoPE scaling {scaling!r} needs the training length it extends (model.rope_train_len)")
        self.head_dim, self.base = head_dim, base
        self.scaling, self.factor, self.train_len = scaling, factor, train_len
        self.beta_fast, self.beta_slow = beta_fast, beta_slow
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @classmethod
    def from_config(cls, ctx):
        c = ctx.cfg
        return cls(ctx.head_dim, c.rope_base, c.rope_scaling, c.rope_scaling_factor, c.rope_train_len,
                   c.rope_yarn_beta_fast, c.rope_yarn_beta_slow)

    def scale_for(self, length: int) -> float:
        """s for a context of `length` positions."""
        if self.scaling == "none":
            return 1.0
        if self.scaling == "dynamic-ntk" or self.factor <= 0:
            return max(1.0, length / self.train_len)
        return float(self.factor)

    def frequencies(self, length: int) -> tuple[torch.Tensor, float]:
        """(theta' [d/2] fp32, the factor on cos and sin) for a context of `length` positions."""
        s, d = self.scale_for(length), self.head_dim
        if self.scaling == "none" or s == 1.0:
            return self.inv_freq, 1.0
        if self.scaling == "pi":
            return self.inv_freq / s, 1.0
        if self.scaling in ("ntk", "dynamic-ntk"):
            base = self.base * s ** (d / (d - 2))
            return base ** (-torch.arange(0, d, 2, dtype=torch.float32, device=self.inv_freq.device) / d), 1.0
        return self.inv_freq * (1 - self.yarn_ramp()) + self.inv_freq / s * self.yarn_ramp(), 0.1 * math.log(s) + 1

    def yarn_ramp(self) -> torch.Tensor:
        """0 for the fast (high-frequency) dimensions YaRN keeps, 1 for the slow ones it interpolates."""
        d = self.head_dim

        def index_of(rotations: float) -> float:
            return d * math.log(self.train_len / (2 * math.pi * rotations)) / (2 * math.log(self.base))

        low = max(math.floor(index_of(self.beta_fast)), 0)
        high = min(math.ceil(index_of(self.beta_slow)), d - 1)
        if low == high:
            high += 0.001  # the authors' guard against a zero-width ramp
        i = torch.arange(d // 2, dtype=torch.float32, device=self.inv_freq.device)
        return ((i - low) / (high - low)).clamp(0, 1)

    def rotate(self, x: torch.Tensor, pos: torch.Tensor, length: int | None = None) -> torch.Tensor:
        inv_freq, mscale = self.frequencies(len(pos) if length is None else length)
        angles = pos.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, d/2]
        cos = (torch.cat([angles.cos(), angles.cos()], -1) * mscale).to(x.dtype)
        sin = (torch.cat([angles.sin(), angles.sin()], -1) * mscale).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def forward(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, length: int | None = None):
        """Rotate q and k [..., T, d] at positions pos [T]; `length` is the context length that sets
        an auto or dynamic scale (default T)."""
        return self.rotate(q, pos, length), self.rotate(k, pos, length)

    def extra_repr(self) -> str:
        if self.scaling == "none":
            return f"base={self.base}"
        factor = "auto" if self.factor <= 0 else self.factor
        return f"base={self.base}, scaling={self.scaling}, factor={factor}, train_len={self.train_len}"
