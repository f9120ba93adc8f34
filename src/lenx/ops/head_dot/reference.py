"""The per-head dot product of x and y [B, H, T, d], in plain PyTorch: the definition the kernel is
tested against,

    out_h = sum over b, t, j of x[b, h, t, j] y[b, h, t, j]      -> [H]

summed in fp32 (float64 for float64 inputs). The products are taken in the inputs' dtype (bf16
products are rounded to bf16 before the sum; the kernel keeps them in fp32)."""

import torch


def head_dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sum(x * y, dim=(0, 2, 3), dtype=torch.promote_types(x.dtype, torch.float32))
