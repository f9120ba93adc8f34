"""The reference backends, straight from the parts' formulas.

dense    the whole [B, H, T, T] score map: the definition every other backend is tested against.
chunked  the same per block of query rows, keys cut at the block's causal edge (plus the processor's
         halo); at most [B, H, chunk, T] live, and blocks are recomputed in backward.
"""

import functools
import math

import torch
from torch.utils.checkpoint import checkpoint

from ..._memory import pin_mmap_threshold
from ..parts import Parts
from .base import Backend


def score_block(q, k, parts: Parts, q_start: int = 0):
    """Pre-normaliser scores of rows q [B, H, c, d] (positions q_start..) against keys k [B, H, Tk, d]
    (positions 0..Tk-1). Returns (raw scaled scores, bias or None, processed scores A)."""
    q_pos = torch.arange(q_start, q_start + q.shape[-2], device=q.device)
    k_pos = torch.arange(k.shape[-2], device=q.device)
    raw = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    bias = parts.bias(q_pos, k_pos, q=q, k=k) if parts.bias is not None else None
    if parts.processor is not None:
        return raw, bias, parts.processor(raw, bias, q, q_pos, k_pos)
    return raw, bias, raw if bias is None else raw + bias.to(raw.dtype)


def block_attention(q, k, v, parts: Parts, q_start: int = 0):
    """Rows q [B, H, c, d] at positions q_start.., keys/values [B, H, Tk, d] at 0..Tk-1.
    Returns (out [B, H, c, d], rem [B, H, c] or None)."""
    _, _, scores = score_block(q, k, parts, q_start)
    q_pos = torch.arange(q_start, q_start + q.shape[-2], device=q.device)
    k_pos = torch.arange(k.shape[-2], device=q.device)
    return parts.normaliser(scores, v, parts.normaliser.allowed(q_pos, k_pos, parts.causal))


def dense_attention(q, k, v, parts: Parts):
    return block_attention(q, k, v, parts, 0)


@functools.cache
def _pin_malloc_once() -> bool:
    # the growing blocks of the chunked path fragment glibc's heap (see lenx._memory)
    return pin_mmap_threshold()


def chunked_attention(q, k, v, parts: Parts, chunk_size: int = 256):
    _pin_malloc_once()
    T = q.shape[-2]
    halo = parts.processor.halo if parts.processor is not None else 0
    sees_future = not parts.causal or (parts.processor is not None and parts.processor.leak)
    recompute = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    outs, rems = [], []
    for q0 in range(0, T, chunk_size):
        q1 = min(T, q0 + chunk_size)
        Tk = T if sees_future else min(T, q1 + halo)
        args = (q[:, :, q0:q1], k[:, :, :Tk], v[:, :, :Tk], parts, q0)
        # Recompute each block in backward so training memory stays at one block, not T x T.
        out, rem = checkpoint(block_attention, *args, use_reentrant=False) if recompute else block_attention(*args)
        outs.append(out)
        rems.append(rem)
    rem = None if rems[0] is None else torch.cat(rems, -1)
    return torch.cat(outs, -2), rem


class Dense(Backend):
    name = "dense"

    def auto(self, device):
        return False  # chunked computes the same in O(T) memory

    def run(self, q, k, v, parts, chunk_size=256):
        return dense_attention(q, k, v, parts)


class Chunked(Backend):
    name = "chunked"

    def run(self, q, k, v, parts, chunk_size=256):
        return chunked_attention(q, k, v, parts, chunk_size)
