"""RoPE's rotation in the rotate-half layout, in plain PyTorch: the definition the fused kernel is
tested against.

With h = r / 2 (r: the rotated dims of a head, the first r of d), for j < h

    y_j = x_j cos_j - x_{j+h} sin_j,    y_{j+h} = x_{j+h} cos_j + x_j sin_j

and y_j = x_j for j >= r. cos, sin [..., T, h] hold one angle per frequency (the cos/sin factor of a
scaled RoPE included); they broadcast over the batch and heads of x [B, H, T, d].
"""

import torch


def rotate_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = cos.shape[-1]
    x1, x2, rest = x[..., :h], x[..., h:2 * h], x[..., 2 * h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], -1)
