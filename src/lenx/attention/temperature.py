"""Query temperatures: each query q_i scaled by a function of n_i, the number of keys it sees (i + 1
at position i when causal; the sequence length when not), after RoPE/PoPE, before any backend.

  ssmax   Scalable-Softmax (Nakanishi 2025, arXiv 2501.19399): q_i <- s_h log(n_i) q_i, s_h learned per
          head (model.temp_ssmax_init, 1 by default: no initialisation was found in the paper, whose
          Fig. 1 illustrates s = 0.43; reimplementations use 1, 0.5 or 0.43)
  logn    Qwen's log-n attention: q_i <- max(1, log(n_i) / log(L)) q_i, L the training length
          (model.temp_train_len)
  l4temp  Llama 4's attention temperature tuning: q_i <- (1 + a log(floor(n_i / f) + 1)) q_i with
          f = model.temp_floor_scale (8192) and a = model.temp_attn_scale (0.1), as its code writes
          it with the cache position p = n_i - 1: log(floor((p + 1) / f) + 1) a + 1

Scaling q scales the q.k logits and nothing else: an additive bias (ALiBi, Kerple, ...) is added
unscaled, and a DAPE processor reads the scaled logits. Every backend (SDPA, the fused kernels, the
chunked reference, decoding) then runs unchanged: the temperature is one elementwise product on q.
"""

import math

import torch
from torch import nn

KINDS = ("ssmax", "logn", "l4temp")


class QueryTemperature(nn.Module):
    def __init__(self, kind: str, n_head: int, train_len: int = 0, ssmax_init: float = 1.0,
                 floor_scale: float = 8192.0, attn_scale: float = 0.1):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"unknown query temperature {kind!r}; choose one of {', '.join(KINDS)}")
        if kind == "logn" and train_len < 2:
            raise ValueError(f"logn needs the training length it is relative to (model.temp_train_len >= 2), "
                             f"got {train_len}")
        if kind == "ssmax" and not (math.isfinite(ssmax_init) and ssmax_init > 0):
            raise ValueError(f"model.temp_ssmax_init must be a positive number (a negative or zero temperature "
                             f"scale flips or flattens every row), got {ssmax_init}")
        if kind == "l4temp" and not (math.isfinite(floor_scale) and floor_scale > 0):
            raise ValueError(f"model.temp_floor_scale must be a positive number, got {floor_scale}")
        if kind == "l4temp" and not (math.isfinite(attn_scale) and attn_scale >= 0):
            raise ValueError(f"model.temp_attn_scale must be >= 0 (a negative one cools long rows), got {attn_scale}")
        self.kind, self.train_len, self.floor_scale, self.attn_scale = kind, train_len, floor_scale, attn_scale
        self.s = nn.Parameter(torch.full((n_head,), float(ssmax_init))) if kind == "ssmax" else None

    @classmethod
    def from_config(cls, ctx):
        c = ctx.cfg
        return cls(ctx.name, ctx.n_head, c.temp_train_len, c.temp_ssmax_init, c.temp_floor_scale, c.temp_attn_scale)

    @property
    def settings(self) -> tuple:
        """What position_term depends on beside the key counts (the layers of a decode step share it)."""
        return (self.kind, self.train_len, self.floor_scale, self.attn_scale)

    def position_term(self, n: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The factor's part that depends on the key counts n ([T] or [B, T], each at least 1 where
        it counts; rows of padding, n <= 0, are taken as 1): [T] or [B, T] in `dtype`."""
        n = n.clamp(min=1).to(dtype)
        if self.kind == "ssmax":
            return torch.log(n)
        if self.kind == "logn":
            return (torch.log(n) / math.log(self.train_len)).clamp(min=1.0)
        return torch.log(torch.floor(n / self.floor_scale) + 1) * self.attn_scale + 1

    def forward(self, q: torch.Tensor, n: torch.Tensor | None = None, term: torch.Tensor | None = None):
        """q [B, H, T, d] scaled row by row; n: the rows' key counts (see position_term), or `term`,
        position_term's result for them. The product is taken in float32 (float64 for float64 q) and
        rounded once to q's dtype, as Llama 4 does."""
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        term = self.position_term(n, dtype) if term is None else term
        factor = term.unsqueeze(-2)  # [1, T] or [B, 1, T]: broadcast over the heads
        if self.s is not None:
            factor = self.s.to(dtype)[:, None] * factor
        return (q * factor.unsqueeze(-1)).to(q.dtype)

    def extra_repr(self) -> str:
        if self.kind == "logn":
            return f"logn, train_len={self.train_len}"
        if self.kind == "l4temp":
            return f"l4temp, floor_scale={self.floor_scale}, attn_scale={self.attn_scale}"
        return "ssmax"
