"""DAPE (Zheng et al. 2024) and DAPE V2 (arXiv 2410.04798): process the score map like an image.

A = S + Bias + f(tril([S; Bias])), f = Conv2d(C -> D, (1, k)) -> LeakyReLU(0.01) -> Conv2d(D -> H, (1, k)),
C = 2H with a bias and H without. The kernel has height 1, so it slides along keys only and every
query row is processed on its own. kernel_size = 1 is DAPE (v1): a per-entry MLP across heads.
"""

import torch
from torch import nn
from torch.nn import functional as F


class DapeV2(nn.Module):
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

    @property
    def halo(self) -> int:
        """Keys past the last query that a row-block needs: conv2 reads conv1 outputs k//2 keys right
        of the diagonal; conv1's inputs there are zero (tril), so k//2 extra keys suffice."""
        return self.kernel_size // 2

    def forward(self, scores: torch.Tensor, bias: torch.Tensor | None = None,
                q_offset: int | None = None) -> torch.Tensor:
        """scores [B, H, Tq, Tk] (scaled), bias broadcastable to it. Query row r sits at absolute
        position q_offset + r (default Tk - Tq: the rows are the last Tq positions). Returns
        S + Bias + f(tril([S; Bias])) with no -inf masking."""
        if self.with_bias and bias is None:
            raise ValueError("this DapeV2 was built with_bias=True (2H input channels) but got no bias")
        if not self.with_bias and bias is not None:
            raise ValueError("this DapeV2 was built with_bias=False (H input channels) but got a bias")
        if bias is not None:
            bias = bias.to(scores.dtype).expand_as(scores)
            x = torch.cat([scores, bias], dim=1)
        else:
            x = scores
        if not self.leak:
            Tq, Tk = scores.shape[-2:]
            offset = Tk - Tq if q_offset is None else q_offset
            future = torch.ones(Tq, Tk, dtype=torch.bool, device=scores.device).triu(offset + 1)
            x = x.masked_fill(future, 0.0)
        f = self.conv2(F.leaky_relu(self.conv1(x), 0.01))
        out = scores + f.to(scores.dtype)
        return out if bias is None else out + bias

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, hidden={self.hidden}, k={self.kernel_size}, with_bias={self.with_bias}, leak={self.leak}"
