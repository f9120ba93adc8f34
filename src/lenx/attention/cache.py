"""Keys and values of one attention layer, kept for decoding token by token, and the attention of
new rows against them (cached_attention: positions per sequence, padding and empty slots masked)."""

import math

import torch
from torch.nn import functional as F


class LayerCache:
    """K (already rotated for RoPE) and V [B, H, capacity, d] of slots 0..capacity-1."""

    def __init__(self, batch: int, heads: int, head_dim: int, capacity: int, device, dtype):
        self.k = torch.zeros(batch, heads, capacity, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor, rows: list[int] | None = None) -> None:
        """Keys and values [b, H, R, d] of slots start..start+R-1, of the sequences `rows` (batch
        indices; None: all of them)."""
        end = start + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"the KV cache holds {self.capacity} positions; position {end - 1} does not fit")
        batch = slice(None) if rows is None else rows
        self.k[batch, :, start:end] = k.to(self.k.dtype)
        self.v[batch, :, start:end] = v.to(self.v.dtype)

    def write_at(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keys and values [B, H, R, d] of the slots `slots` [R] (a long tensor, distinct slots): no
        host sync, so it runs inside a CUDA graph."""
        self.k.index_copy_(2, slots, k.to(self.k.dtype))
        self.v.index_copy_(2, slots, v.to(self.v.dtype))

    def read(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of slots 0..end-1."""
        return self.k[:, :, :end], self.v[:, :, :end]


def cached_attention(q, keys, values, parts, rows: torch.Tensor, start: torch.Tensor, end):
    """Rows q [B, H, R, d] in cache slots `rows` [R] against the keys and values [B, H, Tk, d] of
    slots 0..Tk-1. Sequence b holds slots start[b]..end-1 (start [B]; end an int or a 0-d tensor),
    so the token in slot t is at position t - start[b]; the slots outside (a left-padded batch's
    padding, a fixed-size cache's empty tail) are never attended, and a row outside its sequence
    gives zeros. Every part sees each sequence's own positions (the DAPE convolution reads the
    missing keys as its zero padding, CoPE counts no gate there, stick-breaking breaks no stick
    there), so each row is the row of its sequence's forward alone. -> (out [B, H, R, d], the
    normaliser's rem [B, H, R] or None), as the reference backends' block_attention."""
    Tk = keys.shape[-2]
    slots = torch.arange(Tk, device=q.device)
    q_pos = rows[None, :] - start[:, None]  # [B, R]
    k_pos = slots[None, :] - start[:, None]  # [B, Tk]; padding is at negative positions
    key_valid = (k_pos >= 0) & (slots < end)[None, :]
    bias = parts.bias(q_pos, k_pos, q=q, k=keys) if parts.bias is not None else None
    allowed = (parts.normaliser.allowed(q_pos, k_pos, parts.causal) & key_valid[:, None, :]).unsqueeze(1)
    if parts.processor is None and parts.normaliser.name == "softmax":
        # one fused kernel for the scores, the mask and the softmax (a decode step is launch-bound)
        mask = allowed if bias is None else bias.to(q.dtype).masked_fill(~allowed, float("-inf"))
        out, rem = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask), None
    else:
        raw = torch.matmul(q, keys.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if parts.processor is not None:
            scores = parts.processor(raw, bias, q, q_pos, k_pos, key_valid)
        else:
            scores = raw if bias is None else raw + bias.to(raw.dtype)
        out, rem = parts.normaliser(scores, values, allowed)
    # a row of padding attends no key (softmax gives NaN there): zeros, so its keys stay finite
    return torch.where((q_pos >= 0)[:, None, :, None], out, 0.0), rem
