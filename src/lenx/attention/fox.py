"""FoX, the Forgetting Transformer (Lin et al., ICLR 2025, arXiv 2503.02130): softmax attention whose
logits a data-dependent forget gate pulls down, with no position encoding.

Per head a forget gate of the layer's input x_t, f_t = sigmoid(w_f . x_t + b_f), and

    s_ij = q_i . k_j / sqrt(d) + sum_{l=j+1..i} log f_l = q_i . k_j / sqrt(d) + c_i - c_j,

c the prefix sum of log f along the sequence. w_f ~ N(0, 0.02) and b_f = 0, as the authors' code
initialises its data-dependent gate (zhixuan-lin/forgetting-transformer 883f260, fgate_type "full").

The gate reads x, which a bias's (q_pos, k_pos, q, k) does not carry: the Attention module computes c
from x (ForgetGate.prefix_sums) and hands the backends the part bound to it (ForgetGate.bind), a
bias like any other; a KV cache keeps c of its keys, so a decode step extends it by its rows' gates.

The Pro block's options (the same code's use_output_gate, qk_norm, use_k_shift/use_v_shift,
use_output_norm), each a [model] switch, off by default (FoxPro):
  fox_output_gate  o_t <- o_t * sigmoid(W_g x_t) before the output projection; W_g [C, C] ~ N(0, 0.02)
  fox_output_norm  o_t <- RMSNorm of each head's output with a learned scale (ones), eps 1e-6, before
                   the output gate
  fox_kv_shift     k_t <- a_t k_{t-1} + (1 - a_t) k_t with a_t = sigmoid(w_a . x_t) per head, k_{-1} = 0
                   (k = W_k x before any norm), and so v with its own w; w ~ N(0, 0.02), no bias
  fox_qk_norm      q, k <- RMSNorm over each head's channels with a learned scale (ones), eps 1e-5,
                   after the shift
"""

import torch
from torch import nn
from torch.nn import functional as F

from .parts import ScoreBias

SWITCHES = ("fox_output_gate", "fox_qk_norm", "fox_kv_shift", "fox_output_norm")
QK_NORM_EPS, OUTPUT_NORM_EPS = 1e-5, 1e-6  # the authors' GroupNorm default and their config's norm_eps
UNBOUND = ("FoX's bias reads the layer's input: bind it to the prefix sums of its forget gates "
           "(ForgetGate.bind, as the Attention module does) before a backend runs it")


class ForgetGate(ScoreBias):
    """FoX's forget gate, the bias part of the fox methods: w_f, b_f ([H, C], [H]) in `proj`."""

    per_token = True

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.proj = nn.Linear(d_model, num_heads)
        nn.init.normal_(self.proj.weight, std=0.02)
        nn.init.zeros_(self.proj.bias)

    @classmethod
    def from_config(cls, ctx):
        return cls(ctx.d_model, ctx.n_head)

    def log_forget(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, C] -> log f [B, H, T], in float32 at least (its prefix sums grow with T)."""
        logit = self.proj(x)
        return F.logsigmoid(logit.to(torch.promote_types(logit.dtype, torch.float32))).transpose(1, 2)

    def prefix_sums(self, x: torch.Tensor) -> torch.Tensor:
        """c [B, H, T] of x [B, T, C] at positions 0..T-1: c_t = sum_{l <= t} log f_l."""
        return self.log_forget(x).cumsum(-1)

    def bind(self, c_q: torch.Tensor, c_k: torch.Tensor | None = None) -> "ForgetBias":
        """The bias of these prefix sums (see ForgetBias)."""
        return ForgetBias(c_q, c_k)

    def forward(self, q_pos, k_pos, q=None, k=None):
        raise RuntimeError(UNBOUND)

    def token_values(self):
        raise RuntimeError(UNBOUND)


class ForgetBias(ScoreBias):
    """FoX's bias bound to one input: c_i - c_j. With c_k None, c [B, H, T] holds positions 0..T-1 of
    one forward, which the 1-D positions q_pos and k_pos of a backend's block index. With c_k given
    (a decode step), c_q [B, H, Tq] and c_k [B, H, Tk] are already those of the step's rows and keys.
    Above the diagonal c_i - c_j > 0: the causal mask removes it."""

    def __init__(self, c_q: torch.Tensor, c_k: torch.Tensor | None = None):
        super().__init__()
        self.c_q, self.c_k = c_q, c_k

    def token_values(self):
        return self.c_q if self.c_k is None else None

    def forward(self, q_pos, k_pos, q=None, k=None):
        if self.c_k is None:
            c_q, c_k = self.c_q[..., q_pos], self.c_q[..., k_pos]
        else:
            c_q, c_k = self.c_q, self.c_k
        return c_q[..., :, None] - c_k[..., None, :]


class FoxPro(nn.Module):
    """The Pro block's options that are on (see the module docstring). forward(x, q, k, v) applies the
    key/value shift and the QK-norm to a projection; gate(o, x) the output norm and gate."""

    def __init__(self, d_model: int, num_heads: int, output_gate: bool, qk_norm: bool, kv_shift: bool,
                 output_norm: bool = False):
        super().__init__()
        head_dim = d_model // num_heads
        self.out_gate = nn.Linear(d_model, d_model, bias=False) if output_gate else None
        self.shift = nn.Linear(d_model, 2 * num_heads, bias=False) if kv_shift else None  # a of k, then of v
        for lin in (self.out_gate, self.shift):
            if lin is not None:
                nn.init.normal_(lin.weight, std=0.02)
        self.q_scale = nn.Parameter(torch.ones(num_heads, head_dim)) if qk_norm else None
        self.k_scale = nn.Parameter(torch.ones(num_heads, head_dim)) if qk_norm else None
        self.out_scale = nn.Parameter(torch.ones(num_heads, head_dim)) if output_norm else None

    @classmethod
    def from_config(cls, ctx):
        """None when no switch is on; an error when one is on for a method that is not FoX's."""
        on = [name for name in SWITCHES if getattr(ctx.cfg, name)]
        if not on:
            return None
        if ctx.name != "fox":
            raise ValueError(f"{', '.join('model.' + n for n in on)}: FoX's Pro options need a fox method "
                             f"(fox, dape-fox, dapev2-fox, stickbreaking-fox, ...), not {ctx.cfg.method!r}")
        return cls(ctx.d_model, ctx.n_head, *(getattr(ctx.cfg, name) for name in SWITCHES))

    @property
    def kv_shift(self) -> bool:
        return self.shift is not None

    def forward(self, x, q, k, v, prev=None, real=None):
        """x [B, T, C]; q, k, v [B, H, T, d] its projections. prev: (k, v) [B, H, 1, d] projected from the
        token before the first (None: there is none, zeros); real [B, 1, T, 1]: the rows that are tokens
        (a decode step's padding rows shift nothing into the next)."""
        if self.shift is not None:
            a = torch.sigmoid(self.shift(x)).transpose(1, 2).unsqueeze(-1)  # [B, 2H, T, 1]
            a_k, a_v = a.chunk(2, dim=1)
            k = _shift(k, a_k.to(k.dtype), None if prev is None else prev[0], real)
            v = _shift(v, a_v.to(v.dtype), None if prev is None else prev[1], real)
        if self.q_scale is not None:
            q, k = _rms(q, self.q_scale, QK_NORM_EPS), _rms(k, self.k_scale, QK_NORM_EPS)
        return q, k, v

    def gate(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """o [B, H, T, d] (the heads' outputs) of input x [B, T, C] -> [B, T, C], the heads side by
        side: normalised, then times sigmoid(W_g x)."""
        if self.out_scale is not None:
            o = _rms(o, self.out_scale, OUTPUT_NORM_EPS)
        B, _, T, _ = o.shape
        o = o.transpose(1, 2).reshape(B, T, -1)
        return o if self.out_gate is None else o * torch.sigmoid(self.out_gate(x)).to(o.dtype)


def _shift(t, a, prev, real):
    """t_i <- a_i t_{i-1} + (1 - a_i) t_i along the rows of t [B, H, T, d]; t_{-1} = prev or zeros."""
    before = t if real is None else t * real
    first = torch.zeros_like(t[:, :, :1]) if prev is None else prev.to(t.dtype)
    before = torch.cat([first, before[:, :, :-1]], dim=2)
    return a * before + (1 - a) * t


def _rms(t, scale, eps):
    """RMSNorm of each head's channels of t [B, H, T, d], scale [H, d], in float32 at least (bf16
    under autocast)."""
    wide = t.to(torch.promote_types(t.dtype, torch.float32))
    return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps) * scale[:, None, :]).to(t.dtype)
