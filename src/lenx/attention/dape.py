"""DAPE (Zheng et al. 2024) and DAPE V2 (arXiv 2410.04798): process the score map like an image.

A = S + Bias + f(tril([S; Bias])), f = Conv2d(C -> D, (1, k)) -> LeakyReLU(0.01) -> Conv2d(D -> H, (1, k)),
C = 2H with a bias and H without. The kernel has height 1, so it slides along keys only and every
query row is processed on its own. kernel_size = 1 is DAPE (v1): a per-entry MLP across heads.
The formula itself is lenx.ops.dape_v2.reference.dape_v2_scores; this module owns the weights.
"""

import torch
from torch import nn

from ..ops.dape_v2.reference import dape_v2_scores
from .parts import ScoreProcessor


class DapeV2(ScoreProcessor):
    op = "dape_v2"
    kernel: str | None = None  # the fused kernel that last ran it ("gluon", "skewed (keep)", ...): for run records
    kernel_note: str | None = None  # why that kernel is not the one the shape alone would pick (fused._route)

    def __init__(self, num_heads: int, hidden: int = 32, kernel_size: int = 3, with_bias: bool = True,
                 leak: bool = False):
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"DAPE V2 kernel_size must be an odd integer >= 1, got {kernel_size}")
        self.num_heads, self.hidden, self.kernel_size = num_heads, hidden, kernel_size
        self.with_bias = with_bias
        # leak=True drops the tril: the paper's "information leakage" experiment (section 4.5). With
        # kernel_size > 1 the processed score of key j then sees scores of future keys.
        self.leak = leak
        channels = 2 * num_heads if with_bias else num_heads
        pad = (0, kernel_size // 2)
        self.conv1 = nn.Conv2d(channels, hidden, (1, kernel_size), padding=pad)
        self.conv2 = nn.Conv2d(hidden, num_heads, (1, kernel_size), padding=pad)

    @classmethod
    def from_config(cls, ctx):
        """"dape" is the 1 x 1 kernel; "dapev2" takes model.dape_kernel."""
        k = 1 if ctx.name == "dape" else ctx.cfg.dape_kernel
        return cls(ctx.n_head, ctx.cfg.dape_hidden, k, with_bias=ctx.has_bias, leak=ctx.cfg.dape_leak)

    @property
    def halo(self) -> int:
        """Keys past the last query that a row-block needs: conv2 reads conv1 outputs k//2 keys right
        of the diagonal; conv1's inputs there are zero (tril), so k//2 extra keys suffice."""
        return self.kernel_size // 2

    def conv_weights(self) -> tuple[torch.Tensor, ...]:
        """(w1, b1, w2, b2): what the fused kernel takes."""
        return self.conv1.weight, self.conv1.bias, self.conv2.weight, self.conv2.bias

    def forward(self, scores: torch.Tensor, bias: torch.Tensor | None = None, q: torch.Tensor | None = None,
                q_pos: torch.Tensor | None = None, k_pos: torch.Tensor | None = None,
                key_valid: torch.Tensor | None = None, visible: torch.Tensor | None = None) -> torch.Tensor:
        """scores [B, H, Tq, Tk] (scaled), bias broadcastable to it; q_pos, k_pos the rows' and keys'
        positions (default: the rows are the last Tq of Tk positions); q is not used; key_valid
        [B, Tk] the keys that exist (default: all; see dape_v2_scores), visible the keys a mask
        leaves each row (read as keys past the diagonal; see attention/masks.py). Returns
        S + Bias + f(tril([S; Bias])) with no -inf masking."""
        if self.with_bias and bias is None:
            raise ValueError("this DapeV2 was built with_bias=True (2H input channels) but got no bias")
        if not self.with_bias and bias is not None:
            raise ValueError("this DapeV2 was built with_bias=False (H input channels) but got a bias")
        return dape_v2_scores(scores, bias, *self.conv_weights(), q_pos, k_pos, self.leak, key_valid, visible)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, hidden={self.hidden}, k={self.kernel_size}, with_bias={self.with_bias}, leak={self.leak}"
