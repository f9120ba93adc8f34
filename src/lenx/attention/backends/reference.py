"""The reference backends, straight from the parts' formulas.

dense    the whole [B, H, T, T] score map: the definition every other backend is tested against.
chunked  the same per block of query rows, keys cut at the block's causal edge (plus the processor's
         halo) and, with a window, before its first row's window (less the halo), with the
         processor's query halo of rows before the block (MTA); at most
         [B, H, chunk, T] live, and blocks are recomputed in backward.

Their memory grows with the score map, by as many maps as the composition keeps for its backward
(one for softmax, about 20 under a DAPE processor): score_maps measures that on the composition
itself, with one small block on the CPU.
"""

from dataclasses import replace
import functools
import math

import torch
from torch.utils.checkpoint import checkpoint

from ..._memory import pin_mmap_threshold
from ..masks import key_range, same_document, visible
from ..parts import Parts, normalise
from .base import Backend, LayerMemory, Work


def _positions(q, k, q_start: int, k_start: int):
    q_pos = torch.arange(q_start, q_start + q.shape[-2], device=q.device)
    return q_pos, torch.arange(k_start, k_start + k.shape[-2], device=q.device)


def _visible(parts: Parts, q_pos, k_pos, segments):
    """The window and document mask of these rows and keys (masks.visible), or None."""
    if segments is None:
        return visible(q_pos, k_pos, parts.window)
    return visible(q_pos, k_pos, parts.window, segments[:, q_pos], segments[:, k_pos])


def _raw_scores(q, k):
    """q k^T / sqrt(d) for q [B, H, c, d], k [B, H, Tk, d] (batch dimensions broadcast as matmul's)."""
    d = q.shape[-1]
    if math.log2(d) % 2 or q.shape[:-2] != k.shape[:-2]:
        return torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
    # 1/sqrt(d) a power of two (d = 4, 16, 64, 256): the product scales its own sums (exactly, so the
    # same scores), with no pass over the map each way and nothing more kept for the backward
    q3, k3 = q.flatten(0, -3), k.flatten(0, -3)
    raw = torch.baddbmm(q.new_zeros(()), q3, k3.transpose(-1, -2), beta=0, alpha=1 / math.sqrt(d))
    return raw.view(*q.shape[:-1], k.shape[-2])


def score_block(q, k, parts: Parts, q_start: int = 0, k_start: int = 0, segments=None):
    """Pre-normaliser scores of rows q [B, H, c, d] (positions q_start..) against keys k [B, H, Tk, d]
    (positions k_start..k_start+Tk-1), segments [B, T] the document ids of every position (or None).
    Returns (raw scaled scores, bias or None, processed scores A)."""
    q_pos, k_pos = _positions(q, k, q_start, k_start)
    raw = _raw_scores(q, k)
    bias = parts.bias(q_pos, k_pos, q=q, k=k) if parts.bias is not None else None
    if parts.processor is not None:
        seen = _visible(parts, q_pos, k_pos, segments)
        # passed only when set, so a processor that predates masks still runs unmasked configs
        extra = {} if seen is None else {"visible": seen}
        if segments is not None:  # another document's keys do not exist for the row (masks.py)
            extra["key_valid"] = same_document(segments[:, q_pos], segments[:, k_pos])
        return raw, bias, parts.processor(raw, bias, q, q_pos, k_pos, **extra)
    return raw, bias, raw if bias is None else raw + bias.to(raw.dtype)


def block_attention(q, k, v, parts: Parts, q_start: int = 0, k_start: int = 0, segments=None, context: int = 0):
    """Rows q [B, H, c, d] at positions q_start.., keys/values [B, H, Tk, d] at k_start..,
    segments [B, T] (or None). Returns (out [B, H, c - context, d], rem [B, H, c - context] or None):
    the first `context` rows are only read by the processor's query convolutions (its q_halo) and
    give no output."""
    _, _, scores = score_block(q, k, parts, q_start, k_start, segments)
    # the last rows of the halo whose probabilities the post-softmax step reads (MTA's second convolution)
    post = min(context, parts.processor.post_halo) if parts.processor is not None else 0
    first = context - post
    scores = scores[..., first:, :]
    q_pos, k_pos = _positions(q[..., first:, :], k, q_start + first, k_start)
    allowed = parts.normaliser.allowed(q_pos, k_pos, parts.causal)
    seen = _visible(parts, q_pos, k_pos, segments)
    if seen is not None:
        allowed = allowed & seen if seen.dim() == 2 else (allowed & seen)[:, None]  # [B, 1, Tq, Tk]
    same = None if segments is None else same_document(segments[:, q_pos], segments[:, k_pos])
    return normalise(parts, scores, v, allowed, post, same)


def dense_attention(q, k, v, parts: Parts, segments=None):
    return block_attention(q, k, v, parts, 0, 0, segments)


@functools.cache
def _pin_malloc_once() -> bool:
    # the growing blocks of the chunked path fragment glibc's heap (see lenx._memory)
    return pin_mmap_threshold()


def chunked_attention(q, k, v, parts: Parts, chunk_size: int = 256, segments=None):
    """Blocks of `chunk_size` rows, each against the keys it reads: up to its causal edge (plus the
    processor's halo), and with a window only the last W (plus the halo to the left, which the
    DAPE convolution reads), so the work grows with W, not T."""
    _pin_malloc_once()
    T = q.shape[-2]
    halo = parts.processor.halo if parts.processor is not None else 0
    q_halo = parts.processor.q_halo if parts.processor is not None else 0
    sees_future = not parts.causal or (parts.processor is not None and parts.processor.leak)
    recompute = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    outs, rems = [], []
    for q0 in range(0, T, chunk_size):
        q1 = min(T, q0 + chunk_size)
        a = max(0, q0 - q_halo)  # the rows before the block that its query convolution reads
        k0, k1 = key_range(a, q1, T, parts.window, left=halo, right=T if sees_future else halo)
        args = (q[:, :, a:q1], k[:, :, k0:k1], v[:, :, k0:k1], parts, a, k0, segments, q0 - a)
        # Recompute each block in backward so training memory stays at one block, not T x T.
        out, rem = checkpoint(block_attention, *args, use_reentrant=False) if recompute else block_attention(*args)
        outs.append(out)
        rems.append(rem)
    if len(outs) == 1:  # one block (T <= chunk_size): a cat would copy it
        return outs[0], rems[0]
    rem = None if rems[0] is None else torch.cat(rems, -1)
    return torch.cat(outs, -2), rem


def score_maps(parts: Parts, work: Work) -> float:
    """How many fp32 score maps [B, H, Tq, Tk] (B, H of `work`) the reference keeps for the backward of one
    block of these parts (beyond q, k and v): what autograd saves, measured on a 32 x 64 block on
    the CPU with 1 and 2 sequences, since a part may keep maps per sequence ([B, H, Tq, Tk]) or one
    for the batch (a bias [H, Tq, Tk], the mask [Tq, Tk]). The parts' weights must be on the CPU."""
    one, two = (_saved_bytes(parts, b, work.heads, work.head_dim) for b in (1, 2))
    per_seq = max(0, two - one)
    shared = max(0, one - per_seq)
    return (per_seq * work.batch + shared) / (work.batch * work.heads * _PROBE_Q * _PROBE_K * 4)


_PROBE_Q, _PROBE_K = 32, 64


def _saved_bytes(parts: Parts, batch: int, heads: int, head_dim: int) -> int:
    """Bytes autograd saves for block_attention of the last _PROBE_Q rows of _PROBE_K positions, q,
    k and v themselves aside (each storage once)."""
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        q, k, v = (torch.randn(batch, heads, n, head_dim, requires_grad=True)
                   for n in (_PROBE_Q, _PROBE_K, _PROBE_K))
        if parts.bias is not None and parts.bias.per_token:  # FoX: bound to per-token values, as in a forward
            parts = replace(parts, bias=parts.bias.bind(torch.randn(batch, heads, _PROBE_K, requires_grad=True)))
        inputs = {t.untyped_storage().data_ptr() for t in (q, k, v)}
        saved: dict[int, int] = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in inputs:
                saved[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block_attention(q, k, v, parts, _PROBE_K - _PROBE_Q)
    return sum(saved.values())


class Dense(Backend):
    name = "dense"

    def auto(self, device):
        return False  # chunked computes the same in O(T) memory

    def memory(self, parts, work: Work) -> LayerMemory:
        # training: every layer keeps its maps for the backward, whose gradients take as many again
        # (and one more) in one layer at a time; a forward alone holds its maps and a few score maps
        one = work.batch * work.heads * work.length ** 2 * 4
        maps = score_maps(parts, work)
        if work.training:
            return LayerMemory(kept=round(maps * one), peak=round((maps + 1) * one))
        return LayerMemory(kept=0, peak=round((maps + 3) * one))

    def run(self, q, k, v, parts, chunk_size=256, segments=None):
        return dense_attention(q, k, v, parts, segments)


class Chunked(Backend):
    name = "chunked"

    def memory(self, parts, work: Work) -> LayerMemory:
        # one block of rows at a time (the last has every key): its maps while the forward computes
        # it, and in the backward (which recomputes it) the maps, their gradients and the parts'
        # transient gradients; conservative: tests/model/test_memory.py measures the whole step's tensor
        # peak at 0.6x its estimate for ALiBi and DAPE V2 on this path
        keys = min(work.length, work.chunk_size + parts.window) if parts.window else work.length
        block = work.batch * work.heads * min(work.chunk_size, work.length) * keys * 4
        maps = score_maps(parts, work)
        return LayerMemory(kept=0, peak=round((3 * maps + 1 if work.training else maps + 3) * block))

    def run(self, q, k, v, parts, chunk_size=256, segments=None):
        return chunked_attention(q, k, v, parts, chunk_size, segments)
