"""FIRE (Li et al. 2024): a learned MLP of a progressively normalised log distance."""

import torch
from torch import nn

from .parts import ScoreBias


class FIRE(ScoreBias):
    """Bias = f(psi(i - j) / (psi(max(L, i)) + 1e-6)), psi(x) = log(|c x| + 1).

    c is learned (init 0.1); L = |L_mult * L_init| with L_mult learned (init 1) and L_init fixed.
    f = Linear(1, width) -> activation -> Linear(width, H). The normaliser uses the query position i;
    in bidirectional use it uses max(i, j) so the ratio stays in [0, 1]. Under document segments i
    is the query's position in its document (ScoreBias.at).
    """

    absolute = True

    def __init__(self, num_heads: int, causal: bool = True, width: int = 32, L_init: float = 512.0,
                 c_init: float = 0.1, activation: str = "relu", eps: float = 1e-6):
        super().__init__()
        self.causal, self.L_init, self.eps = causal, float(L_init), eps
        self.c = nn.Parameter(torch.tensor(c_init))
        self.L_mult = nn.Parameter(torch.tensor(1.0))
        act = {"relu": nn.ReLU(), "leaky_relu": nn.LeakyReLU(0.01)}[activation]
        self.mlp = nn.Sequential(nn.Linear(1, width), act, nn.Linear(width, num_heads))

    @classmethod
    def from_config(cls, ctx):
        act = ctx.cfg.fire_activation
        if act == "auto":  # relu alone, leaky_relu under a DAPE processor
            act = "leaky_relu" if ctx.processor else "relu"
        return cls(ctx.n_head, ctx.cfg.causal, ctx.cfg.fire_width, ctx.cfg.fire_L_init, activation=act)

    def psi(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(torch.abs(self.c * x) + 1)

    def forward(self, q_pos, k_pos, q=None, k=None):
        i = q_pos.to(self.c.dtype)[..., :, None]  # q_pos [Tq] or, per sequence, [B, Tq]
        j = k_pos.to(self.c.dtype)[..., None, :]
        if self.causal:
            dist, anchor = (i - j).clamp(min=0), i
        else:
            dist, anchor = (i - j).abs(), torch.maximum(i, j)
        L = torch.abs(self.L_mult * self.L_init)
        ratio = self.psi(dist) / (self.psi(torch.maximum(L, anchor)) + self.eps)
        return self.mlp(ratio.unsqueeze(-1)).movedim(-1, -3)  # [H, Tq, Tk] or [B, H, Tq, Tk]
