"""PoPE, polar coordinate position embedding (Gopalakrishnan, Csordas, Schmidhuber, Mozer 2025, arXiv
2509.10534): a RoPE replacement whose magnitudes carry the content and whose phases carry the position
alone. Each of the d components c of a query at position i and a key at position j becomes a complex
number mu e^{i phi}:

  mu_q = softplus(q_c), phi_q = i theta_c;  mu_k = softplus(k_c), phi_k = j theta_c + delta_{h,c}
  score(i, j) = Re sum_c q~_c conj(k~_c) / sqrt(d) = sum_c mu_q mu_k cos((i - j) theta_c - delta_{h,c}) / sqrt(d)

with d frequencies theta_c = base^(-c/d), c = 0 .. d - 1 (RoPE has d/2), and a learned phase bias
delta per head and component, clamped to [-2 pi, 0] and initialised at 0. In real arithmetic q and k
become [mu cos phi, mu sin phi], 2d wide (v keeps d), so every backend computes PoPE's score as a dot
product; q also takes a factor sqrt(2), since the backends divide by the square root of the q/k width.

Assumed where the audit's formula (lenx audit field-2026-11-28, section 1) leaves it open, as the
reference code it names (x-transformers' PolarEmbedding) does: the bias on the key's phase (the audit
writes +delta on the score: the same family, delta's sign flipped), its zero initialisation and the
clamp, the base 10000, the 1/sqrt(d) of the original head width, softplus in float32.

RoPE's context extensions (PI, NTK, YaRN) rescale RoPE's frequencies; PoPE has other frequencies and
claims extrapolation without them, so model.rope_scaling must stay none.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F


class PoPE(nn.Module):
    def __init__(self, head_dim: int, n_head: int, base: float = 10000.0):
        super().__init__()
        if not (math.isfinite(base) and base > 1):
            raise ValueError(f"model.pope_base must be a number above 1, got {base}")
        self.head_dim, self.base = head_dim, base
        self.key_dim = 2 * head_dim  # the width of q and k after the transform (v keeps head_dim)
        inv_freq = base ** (-torch.arange(head_dim, dtype=torch.float64) / head_dim)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.phase_bias = nn.Parameter(torch.zeros(n_head, head_dim))

    @classmethod
    def from_config(cls, ctx):
        c = ctx.cfg
        if c.rope_scaling != "none":
            raise ValueError(f"model.rope_scaling={c.rope_scaling} extends RoPE's frequencies; PoPE has its own and "
                             "takes none (set model.rope_scaling=none)")
        return cls(ctx.head_dim, ctx.n_head, c.pope_base)

    @property
    def settings(self) -> tuple:
        return (self.head_dim, self.base)

    def angles(self, pos: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """pos theta_c: [T, d] for positions [T], or [B, 1, T, d] for positions per sequence [B, T]."""
        angles = pos.to(dtype)[..., None] * self.inv_freq.to(dtype)
        return angles.unsqueeze(-3) if angles.dim() == 3 else angles

    @staticmethod
    def polar(x: torch.Tensor, phase: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
        """[mu cos phase, mu sin phase] * factor, mu = softplus(x): x [..., d] -> [..., 2d] in x's dtype."""
        mu = F.softplus(x.to(phase.dtype)) * factor
        return torch.cat([mu * phase.cos(), mu * phase.sin()], -1).to(x.dtype)

    def transform(self, q: torch.Tensor, k: torch.Tensor, angles: torch.Tensor):
        """q, k [B, H, T, d] at the positions of `angles` -> q~, k~ [B, H, T, 2d]."""
        delta = self.phase_bias.clamp(-2 * math.pi, 0).to(angles.dtype)[:, None, :]  # [H, 1, d]
        return self.polar(q, angles, math.sqrt(2)), self.polar(k, angles + delta)

    def forward(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor | None = None, length=None,
                heads_last: bool = False):
        """q, k [B, H, T, d] at positions pos [T] (or [B, T]; None: 0..T-1) -> [B, H, T, 2d]; `length`
        and RoPE's layout hint heads_last are unused (no scale follows the length; the transform's
        PyTorch ops choose their outputs' layout)."""
        pos = torch.arange(q.shape[-2], device=q.device) if pos is None else pos
        return self.transform(q, k, self.angles(pos, _work_dtype(q)))

    def project(self, qkv: torch.Tensor, pos: torch.Tensor | None = None, length=None, heads_last: bool = False):
        """The projection's output qkv [B, T, 3, H, d] -> q, k [B, H, T, 2d] and v [B, H, T, d]."""
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        return (*self(q, k, pos, length, heads_last), v)

    def step(self, qk: torch.Tensor, step):
        """A decode step's rows (qk: q and k stacked, [2, B, H, R, d]) at step.q_pos; the layers of
        the step share one table of angles."""
        dtype = _work_dtype(qk)
        angles = step.shared(("pope", self.settings, dtype), lambda: self.angles(step.q_pos, dtype))
        return self.transform(qk[0], qk[1], angles)

    def extra_repr(self) -> str:
        return f"base={self.base}"


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 for float64 operands (the references), else float32 (under bf16 too, as the
    reference implementation computes)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32
