"""Keys and values of one attention layer, kept for decoding token by token, and the attention of
new rows against them (cached_attention: positions per sequence, padding and empty slots masked).

A decode step runs every layer over the same rows and slots, so what depends only on them (the
positions, which keys exist, each normaliser's mask, the relative distances, RoPE's cos and sin) is
computed once per step in a StepRows and shared by the layers (a CUDA graph of the step then holds
these kernels once, not once per layer)."""

from contextlib import nullcontext
import math

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .masks import visible
from .parts import normalise

# cuDNN's SDPA builds an execution plan for every new shape (~4 ms a layer on an H100, torch 2.11):
# fine for a step of fixed shapes, ruinous for one whose key count grows by a token each step. Without
# it a masked SDPA runs the memory-efficient kernel, one block of rows per head (12 blocks walking
# 8192 keys: ~0.45 ms a layer on an H100), so a step of few rows takes the plain product and softmax
# (three bandwidth-bound kernels) while its scores stay small.
_GROWING_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
_SMALL_SCORES = 1 << 24  # score entries (B H R Tk) up to which a growing step uses the plain product


def _sdpa_backends(step, n_scores: int):
    if not step.grows:
        return nullcontext()
    return sdpa_kernel([SDPBackend.MATH] if n_scores <= _SMALL_SCORES else _GROWING_SDPA)


class LayerCache:
    """K (already rotated for RoPE) and V [B, H, capacity, d] of slots 0..capacity-1 (K key_dim wide
    when the q/k transform widens it: PoPE); with keep_q their queries Q too (MTA's query convolution
    reads the score rows of the c_q - 1 queries before each new row, which a step recomputes from their
    cached queries against all the keys: O(c_q T) per step); and what the layer keeps per slot beside
    them (`extra`: {name: (shape after [B, capacity], dtype)}; FoX: the prefix sums of its forget
    gates, "c" [B, capacity, H]), zeros where nothing was written. ring: 0 (every slot kept;
    RingCache keeps the last few)."""

    ring = 0

    def __init__(self, batch: int, heads: int, head_dim: int, capacity: int, device, dtype, key_dim: int | None = None,
                 extra=None, keep_q: bool = False):
        self.k = torch.zeros(batch, heads, capacity, key_dim or head_dim, device=device, dtype=dtype)
        self.v = torch.zeros(batch, heads, capacity, head_dim, device=device, dtype=dtype)
        self.q = torch.zeros_like(self.k) if keep_q else None
        self.extra = {name: torch.zeros(batch, capacity, *shape, device=device, dtype=dt)
                      for name, (shape, dt) in (extra or {}).items()}

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor, rows: list[int] | None = None,
              q: torch.Tensor | None = None, **extra) -> None:
        """Keys and values [b, H, R, d] of slots start..start+R-1, of the sequences `rows` (batch
        indices; None: all of them), their queries q when this cache keeps them, and `extra` [b, R, ...]
        of those slots by name."""
        end = start + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"the KV cache holds {self.capacity} positions; position {end - 1} does not fit")
        batch = slice(None) if rows is None else rows
        self.k[batch, :, start:end] = k.to(self.k.dtype)
        self.v[batch, :, start:end] = v.to(self.v.dtype)
        if self.q is not None:
            self.q[batch, :, start:end] = q.to(self.q.dtype)
        for name, value in extra.items():
            self.extra[name][batch, start:end] = value.to(self.extra[name].dtype)

    def write_at(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor | None = None,
                 **extra) -> None:
        """Keys and values [B, H, R, d] of the slots `slots` [R] (a long tensor, distinct slots), their
        queries q when this cache keeps them, and `extra` [B, R, ...] by name: no host sync, so it runs
        inside a CUDA graph."""
        self.k.index_copy_(2, slots, k.to(self.k.dtype))
        self.v.index_copy_(2, slots, v.to(self.v.dtype))
        if self.q is not None:
            self.q.index_copy_(2, slots, q.to(self.q.dtype))
        for name, value in extra.items():
            self.extra[name].index_copy_(1, slots, value.to(self.extra[name].dtype))

    def before(self, name: str, first: torch.Tensor) -> torch.Tensor:
        """extra[name] of the slot before `first` (a 1-element long tensor) [B, 1, ...]; zeros before
        slot 0. No host sync."""
        kept = self.extra[name].index_select(1, self._index((first - 1).clamp(min=0)))
        return kept * (first > 0).to(kept.dtype)

    def _index(self, slots):
        """Where slots are kept (a ring wraps them)."""
        return slots

    def read(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of slots 0..end-1."""
        return self.k[:, :, :end], self.v[:, :, :end]

    def read_step(self, step: "StepRows") -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values a decode step's rows read (step.key_slots(self.ring) says their slots)."""
        return self.read(step.n_keys)

    def read_extra(self, name: str, step: "StepRows") -> torch.Tensor:
        """extra[name] [B, Tk, ...] of the slots a decode step's rows read, as read_step orders them."""
        return self.extra[name][:, :step.n_keys]

    def slot_tensors(self):
        """(tensor, its slot dimension) of everything this cache keeps per slot."""
        q = [(self.q, 2)] if self.q is not None else []
        return [(self.k, 2), (self.v, 2)] + q + [(kept, 1) for kept in self.extra.values()]

    def copy_from(self, other: "LayerCache", n: int) -> None:
        """Take the first n slots of a smaller cache of the same layer (a cache that grows)."""
        for (mine, dim), (theirs, _) in zip(self.slot_tensors(), other.slot_tensors()):
            mine.narrow(dim, 0, n).copy_(theirs.narrow(dim, 0, n))


class RingCache(LayerCache):
    """The cache of a windowed layer: only the last `size` slots, slot t at index t % size, so that
    it does not grow with the context. A decode step reads the ring in slot order (the DAPE
    convolution and stick-breaking read keys in order), slots end - size..end - 1; size covers a
    step's rows, MTA's query halo above them, the window before the first of those and the DAPE
    convolution's reach left of that, so the slot before a step's first row (whose extras FoX's
    step extends: `before`) is still there. K may be key_dim wide (PoPE); with keep_q it keeps the
    slots' queries too (MTA's halo rows), and the extras (FoX's c and x) ride in the ring with their
    slots."""

    def __init__(self, batch: int, heads: int, head_dim: int, size: int, device, dtype, key_dim: int | None = None,
                 extra=None, keep_q: bool = False):
        super().__init__(batch, heads, head_dim, size, device, dtype, key_dim, extra, keep_q)
        self.ring = size

    def write(self, start: int, k, v, rows=None, q=None, **extra) -> None:
        R = k.shape[2]
        new = [k, v] + ([] if self.q is None else [q]) + [extra[name] for name in self.extra]
        if R > self.ring:  # a prompt longer than the ring: its last slots
            new = [t.narrow(dim, R - self.ring, self.ring) for t, (_, dim) in zip(new, self.slot_tensors())]
            start += R - self.ring
        index = torch.arange(start, start + min(R, self.ring), device=self.k.device) % self.ring
        for (mine, dim), value in zip(self.slot_tensors(), new):
            if rows is None:
                mine.index_copy_(dim, index, value.to(mine.dtype))
            else:
                mine[rows] = mine[rows].index_copy(dim, index, value.to(mine.dtype))

    def write_at(self, slots, k, v, q=None, **extra) -> None:
        super().write_at(self._index(slots), k, v, q, **extra)

    def _index(self, slots):
        return slots % self.ring

    def read_step(self, step):
        order = self._index(step.key_slots(self.ring)[0])
        return self.k.index_select(2, order), self.v.index_select(2, order)

    def read_extra(self, name: str, step) -> torch.Tensor:
        return self.extra[name].index_select(1, self._index(step.key_slots(self.ring)[0]))

    def copy_from(self, other, n: int) -> None:
        slots = torch.arange(max(0, n - other.capacity), n, device=self.k.device)
        for (mine, dim), (theirs, _) in zip(self.slot_tensors(), other.slot_tensors()):
            mine.index_copy_(dim, slots % self.ring, theirs.index_select(dim, slots % theirs.shape[dim]))


class StepRows:
    """The rows [R] (cache slots, a long tensor) that one decode step computes in every layer, of
    sequences that hold slots start[b]..end-1 (start [B]; end an int or a 0-d tensor), against the
    keys of slots 0..n_keys-1: the token in slot t is at position t - start[b]. rows_real: the host
    knows that every row is a token of its sequence, none its padding (new tokens appended to a
    cache whose sequences each hold one at least), so no row needs zeroing. grows: n_keys changes from
    one step to the next (LM.decode), so no kernel that plans per shape is used.

    shared(key, make) computes what every layer asks for alike once per step (key: what it depends on
    beside the rows)."""

    def __init__(self, rows: torch.Tensor, start: torch.Tensor, end, n_keys: int, rows_real: bool = False,
                 grows: bool = False):
        self.rows, self.start, self.end, self.n_keys, self.rows_real = rows, start, end, n_keys, rows_real
        self.grows = grows
        slots = torch.arange(n_keys, device=rows.device)
        self.q_pos = rows[None, :] - start[:, None]  # [B, R]
        self.k_pos = slots[None, :] - start[:, None]  # [B, Tk]; padding is at negative positions
        self.key_valid = (self.k_pos >= 0) & (slots < end)[None, :]
        self._shared: dict = {}

    def key_slots(self, ring: int = 0):
        """(slots [Tk], positions [B, Tk], which exist [B, Tk]) of the keys a layer reads: slots
        0..n_keys-1, or with a ring of that size the last `ring` slots before end (RingCache)."""
        if not ring:
            return None, self.k_pos, self.key_valid

        def make():
            slots = torch.arange(ring, device=self.rows.device) + (self.end - ring)
            k_pos = slots[None, :] - self.start[:, None]
            return slots, k_pos, (k_pos >= 0) & (slots >= 0)[None, :]
        return self.shared(("ring", ring), make)

    def shared(self, key, make):
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]


def cached_attention(q, keys, values, parts, step: StepRows, ring: int = 0, queries=None):
    """Rows q [B, H, R, d] in cache slots step.rows against the keys and values [B, H, Tk, d] of
    slots 0..Tk-1 (Tk = step.n_keys), or of the last `ring` slots (a RingCache's read_step). The
    slots outside a sequence (a left-padded batch's padding, a fixed-size cache's empty tail) are
    never attended, and a row outside its sequence gives zeros.
    Every part sees each sequence's own positions (the DAPE convolution reads the missing keys as
    its zero padding, CoPE counts no gate there, stick-breaking breaks no stick there), so each row
    is the row of its sequence's forward alone. -> (out [B, H, R, d], the normaliser's rem [B, H, R]
    or None), as the reference backends' block_attention. A processor with a query halo h (MTA)
    reads the h rows before the step's first too (the rows are consecutive slots): their queries
    come from `queries` [B, H, capacity, d], the cache's (LayerCache.q, a ring's slot t at t % ring),
    and the last post_halo of them go through the softmax for its post-softmax step."""
    q_pos = step.q_pos
    _, k_pos, key_valid = step.key_slots(ring)
    norm, bias_part = parts.normaliser, parts.bias
    # a window hides keys as the causal cut does (masks.py); [B, R, Tk] or None
    seen = step.shared(("window", parts.window, ring), lambda: visible(q_pos, k_pos, parts.window))
    def make_allowed():
        allowed = norm.allowed(q_pos, k_pos, parts.causal) & key_valid[:, None, :]
        return (allowed if seen is None else allowed & seen).unsqueeze(1)
    allowed = step.shared(("allowed", norm.allowed_key, parts.causal, parts.window, ring), make_allowed)
    h = parts.processor.q_halo if parts.processor is not None else 0
    if h:  # slots before the cache's first read as rows at negative positions: Mask_0 zeroes them
        slots = step.rows[:1] - h + torch.arange(h, device=q.device)
        index = slots.clamp(min=0) % ring if ring else slots.clamp(min=0)
        q = torch.cat([queries.index_select(2, index).to(q.dtype), q], 2)
        q_pos = torch.cat([slots[None, :] - step.start[:, None], q_pos], 1)
        if seen is not None:  # the halo rows' windows too
            seen = visible(q_pos, k_pos, parts.window)
    bias = None
    if bias_part is not None and bias_part.per_distance and not h:  # the layers' distances are the same
        dtype = bias_part.distance_dtype
        dist = step.shared(("distance", type(bias_part).distance, bias_part.causal, dtype, ring), lambda: (
            bias_part.distance(q_pos, k_pos) if dtype is None else bias_part.distance(q_pos, k_pos).to(dtype)))
        bias = bias_part.from_distance(dist).movedim(0, -3)
    elif bias_part is not None:
        bias = bias_part(q_pos, k_pos, q=q, k=keys)
    if parts.processor is None and norm.name == "softmax":
        # one fused kernel for the scores, the mask and the softmax (a decode step is launch-bound)
        blocked = step.shared(("blocked", norm.allowed_key, parts.causal, parts.window, ring), lambda: ~allowed)
        if bias is None:  # an additive mask once per step: SDPA would turn a boolean one into it in every layer
            key = ("additive", norm.allowed_key, parts.causal, parts.window, ring, q.dtype)
            mask = step.shared(key, lambda: torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(
                blocked, float("-inf")))
        else:
            mask = bias.to(q.dtype).masked_fill(blocked, float("-inf"))
        with _sdpa_backends(step, q.shape[0] * q.shape[1] * q.shape[2] * keys.shape[2]):
            out, rem = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask), None
    else:
        raw = torch.matmul(q, keys.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        post = parts.processor.post_halo if parts.processor is not None else 0
        if parts.processor is not None:
            extra = {} if seen is None else {"visible": seen}
            scores = parts.processor(raw, bias, q, q_pos, k_pos, key_valid, **extra)[..., h - post:, :]
        else:
            scores = raw if bias is None else raw + bias.to(raw.dtype)
        if post:  # the rows whose probabilities the post-softmax convolution reads go through the softmax too
            allowed = norm.allowed(q_pos[:, h - post:], k_pos, parts.causal) & key_valid[:, None, :]
            allowed = (allowed if seen is None else allowed & seen[:, h - post:]).unsqueeze(1)
        out, rem = normalise(parts, scores, values, allowed, post)
    if step.rows_real:
        return out, rem
    # a row of padding attends no key (softmax gives NaN there): zeros, so its keys stay finite
    real = step.shared("real rows", lambda: (step.q_pos >= 0)[:, None, :, None])
    return torch.where(real, out, 0.0), rem
