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
chunked reference, decoding) then runs unchanged: the temperature is one elementwise product on q
(which the fused biased-softmax and FoX kernels take into their score scale: below).

Its cost is kept to that product. The position term is a [T] (or [B, T]) table that the layers of a
forward share (Attention.project's memo, like a decode step's StepRows.shared); the table stays in
fp32 (float64 for float64 q): it is T numbers, and a bf16 one would round log n to steps of 2^-5
near 6, one factor for whole bands of positions. q is scaled by one elementwise op each way
(scale_rows: the product in fp32, rounded once to q's dtype into a contiguous tensor, the bits of
`(q * f).to(q.dtype)`; after RoPE's fused kernel, by that kernel as it rotates q, no pass of its
own), and SSMax's s_h gets its gradient from one reduction over the output
(ssmax_grad: d/ds_h of y = s_h log(n) q is y / s_h; on CUDA one Triton launch, ops/head_dot, that
reads dy and y in whatever layout they come and writes no product), so no fp32 copy of q and no
input q is kept for the backward: the output, which the attention keeps anyway, serves.

Before the fused biased-softmax and FoX kernels (Kerple, ALiBi, T5, FoX on the triton backend) q is
not scaled at all: the attention passes factor(term, grad=True) to them (q_scale), they fold it
into their score scale, and their dq kernel gives the factor, and through it s_h, its gradient.
"""

import math

import torch
from torch import nn

from ..ops.head_dot.route import head_dot

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

    def factor(self, term: torch.Tensor, grad: bool = False) -> torch.Tensor:
        """The rows' factors from position_term's table: [1, T] or [B, 1, T], SSMax's [H, T] or
        [B, H, T], in the table's dtype; s_h held fixed (no gradient), or with grad SSMax's s_h
        gets its gradient through it (for kernels that give their row factor its gradient)."""
        factor = term.unsqueeze(-2)  # broadcast over the heads
        if self.s is None:
            return factor
        return (self.s if grad else self.s.detach()).to(term.dtype)[:, None] * factor

    def forward(self, q: torch.Tensor, n: torch.Tensor | None = None, term: torch.Tensor | None = None,
                folded: bool = False):
        """q [B, H, T, d] scaled row by row; n: the rows' key counts (see position_term), or `term`,
        position_term's result for them. The product is taken in float32 (float64 for float64 q) and
        rounded once to q's dtype, as Llama 4 does. folded: q carries factor(term) already (RoPE's
        fused kernel scaled its rows): only s_h's gradient is attached."""
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        term = self.position_term(n, dtype) if term is None else term
        if torch.compiler.is_compiling():  # the plain ops, s_h's gradient by autograd: inductor fuses them
            factor = term.unsqueeze(-2)
            if self.s is not None:
                factor = self.s.to(dtype)[:, None] * factor
            return (q * factor.unsqueeze(-1)).to(q.dtype)
        y = q if folded else scale_rows(q, self.factor(term))
        return ssmax_grad(y, self.s) if self.s is not None and torch.is_grad_enabled() and self.s.requires_grad else y

    def extra_repr(self) -> str:
        if self.kind == "logn":
            return f"logn, train_len={self.train_len}"
        if self.kind == "l4temp":
            return f"l4temp, floor_scale={self.floor_scale}, attn_scale={self.attn_scale}"
        return "ssmax"


class _ScaleRows(torch.autograd.Function):
    """y = q * f[..., None], f a table with no gradient: one elementwise op each way; saves only f."""

    @staticmethod
    def forward(ctx, q, f):
        ctx.save_for_backward(f)
        return _scaled(q, f)

    @staticmethod
    def backward(ctx, dy):
        (f,) = ctx.saved_tensors
        return _scaled(dy, f), None


def _scaled(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, d] times f [..., T] broadcast over d, in f's precision, written once (a contiguous
    tensor in x's dtype: on CUDA one kernel that casts as it stores)."""
    return torch.mul(x, f.unsqueeze(-1), out=torch.empty(x.shape, dtype=x.dtype, device=x.device))


def scale_rows(q: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """q [B, H, T, d] with row t of head h times f (broadcast to [B, H, T]; fp32, or float64 for
    float64 q; no gradient): contiguous, q's dtype, differentiable in q."""
    return _ScaleRows.apply(q, f.detach())


class _SSMaxGrad(torch.autograd.Function):
    """The identity on y = s_h log(n) q (q's own path carries its gradient, with s_h held fixed),
    whose backward gives s_h its gradient: sum over b, t, d of dy y / s_h, one reduction."""

    @staticmethod
    def forward(ctx, y, s):
        ctx.save_for_backward(y, s)
        return y.view_as(y)

    @staticmethod
    def backward(ctx, dy):
        y, s = ctx.saved_tensors
        # sum over b, t, d of dy y in fp32: one Triton launch on CUDA (dy and y read by their strides),
        # else the plain ops. s_h = 0 exactly would zero the head's rows and make this 0/0: a
        # non-positive initial s is refused, and an optimiser step landing on 0.0 is not expected
        return dy, (head_dot(dy, y) / s).to(s.dtype)


def ssmax_grad(y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """y [B, H, T, d] = s_h log(n) q computed with s held fixed (scale_rows) -> y itself, with s's
    gradient attached."""
    return _SSMaxGrad.apply(y, s)
