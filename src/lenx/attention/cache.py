"""Keys and values of one attention layer, kept for decoding token by token."""

import torch


class LayerCache:
    """K (already rotated for RoPE) and V [B, H, capacity, d] of positions 0..capacity-1."""

    def __init__(self, batch: int, heads: int, head_dim: int, capacity: int, device, dtype):
        self.k = torch.zeros(batch, heads, capacity, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keys and values [B, H, R, d] of positions start..start+R-1."""
        end = start + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"the KV cache holds {self.capacity} positions; position {end - 1} does not fit")
        self.k[:, :, start:end] = k.to(self.k.dtype)
        self.v[:, :, start:end] = v.to(self.v.dtype)

    def read(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions 0..end-1."""
        return self.k[:, :, :end], self.v[:, :, :end]
