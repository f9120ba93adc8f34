"""The one attention module: a q/k transform, a score bias, a score processor and a normaliser,
built from the method registry (methods.py)."""

from dataclasses import replace

import torch
from torch import nn

from ..config import AttentionConfig
from . import profiling
from .backends import plan_backend, run_backend
from .cache import LayerCache, StepRows, cached_attention
from .masks import check_segments
from .methods import BASES, NORMALISERS, PROCESSORS, parse_method
from .parts import PartContext, Parts


class Attention(nn.Module):
    def __init__(self, cfg: AttentionConfig, n_head: int, d_model: int, shared: dict | None = None):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model {d_model} is not divisible by n_head {n_head}")
        self.cfg, self.n_head, self.head_dim = cfg, n_head, d_model // n_head
        spec = self.spec = parse_method(cfg.method)
        if not cfg.causal and spec.causal_only:
            raise ValueError(f"method {spec.name!r} is causal by construction and cannot run non-causally")
        if cfg.window < 0 or (cfg.window and not cfg.causal):
            raise ValueError(f"window must be 0 (global) or >= 1 keys, on a causal attention; got window={cfg.window}"
                             f"{'' if cfg.causal else ' with causal=False'}")
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        ctx = PartContext(spec.base, cfg, n_head, self.head_dim, d_model, {} if shared is None else shared,
                          spec.processor)
        base = BASES[spec.base]
        built = base.build(ctx) if base.role else None
        self.rope = built if base.role == "qk" else None
        self.bias = built if base.role == "bias" else None
        ctx.has_bias = self.bias is not None
        if spec.processor:
            ctx.name = spec.processor
            self.processor = PROCESSORS[spec.processor].build(ctx)
        else:
            self.processor = built if base.role == "processor" else None
        ctx.name = spec.normaliser
        self.normaliser = NORMALISERS[spec.normaliser].build(ctx)
        self.parts = Parts(self.bias, self.processor, self.normaliser, cfg.causal, self.head_dim, cfg.window)
        # Fail at construction, not at the first forward, when a forced backend cannot run this
        # composition (triton is judged for CUDA, the only device it runs on).
        plan_backend(self.parts, torch.device("cuda" if cfg.backend == "triton" else "cpu"), cfg.backend)

    def backend_for(self, device: torch.device, segments: bool = False) -> str:
        """The backend for this layer on `device`, for a call with document ids when `segments`."""
        return plan_backend(self.parts_for(segments), device, self.cfg.backend)

    def parts_for(self, segments: bool) -> Parts:
        return replace(self.parts, segments=True) if segments else self.parts

    def _qkv(self, x: torch.Tensor):
        B, T, _ = x.shape
        return self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)

    def project(self, x: torch.Tensor, positions: torch.Tensor | None = None, length=None):
        """x [B, T, C] -> q, k, v [B, H, T, d], q and k already rotated when the base is RoPE (at
        `positions`, default 0..T-1, or per sequence [B, T]; `length`, default T, or per sequence
        a tensor [B], sets a scaled RoPE's auto or dynamic factor)."""
        q, k, v = self._qkv(x)
        if self.rope is not None:
            T = x.shape[1]
            q, k = self.rope(q, k, torch.arange(T, device=x.device) if positions is None else positions, length)
        return q, k, v

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None, rows: list[int] | None = None,
                at: int = 0, segments: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, C] at positions 0..T-1; segments [B, T] their document ids (None: one document;
        no row attends across a document boundary). With a cache (a prefill), their keys and
        values go to its slots at..at+T-1 of the sequences `rows` (None: all)."""
        B, T, C = x.shape
        check_segments(segments, B, T)
        if cache is not None and segments is not None:
            raise ValueError("decoding has no document segments: a prompt is one document")
        q, k, v = self.project(x)
        if cache is not None:
            cache.write(at, k, v, rows)
        if profiling.active():  # `lenx bench --train-step`: attention's kernels marked for torch.profiler
            out = profiling.marked(lambda q, k, v: self.attend(q, k, v, segments), q, k, v)
        else:
            out = self.attend(q, k, v, segments)
        return self.proj(out.transpose(1, 2).reshape(B, T, C))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments=None) -> torch.Tensor:
        """The attention itself: q, k, v [B, H, T, d] (q and k already rotated), segments [B, T] or
        None -> out [B, H, T, d]."""
        parts = self.parts_for(segments is not None)
        backend = plan_backend(parts, q.device, self.cfg.backend)
        out, rem = run_backend(backend, q, k, v, parts, self.cfg.chunk_size, segments)
        return self.normaliser.finish(out, rem, v)

    def extend(self, x: torch.Tensor, cache: LayerCache, step: StepRows) -> torch.Tensor:
        """Rows x [B, R, C] in cache slots step.rows of sequences that hold slots start[b]..end-1
        (see cache.StepRows): writes the rows' keys and values into the cache and returns their
        outputs [B, R, C], each the row of its sequence's forward over its tokens up to slot end - 1.
        O(R T) work, never a [T, T] map. Keys are read from slots 0..step.n_keys-1; a fixed n_keys
        (the capacity, with end a tensor) keeps every shape the same from one token to the next
        (LM.static_step).

        A RoPE scale that follows the length takes each sequence's length at this step (its tokens
        up to slot end - 1) for the rows' q and k; the cached keys keep the rotation they were
        written with, as transformers' dynamic RoPE has it (rotating them again would not make the
        rows those of a full forward either: every hidden state before them would change too)."""
        B, R, C = x.shape
        qkv = self._qkv(x)
        q, k, v = qkv
        if self.rope is not None:  # one table for the step's layers; q and k rotated together (one set of ops)
            cos, sin = step.shared(("rope", self.rope.settings, q.dtype),
                                   lambda: self.rope.step_table(step.q_pos, step.end - step.start, q.dtype))
            q, k = self.rope.rotate_signed(qkv[:2], cos, sin)
        cache.write_at(step.rows, k, v)
        keys, values = cache.read_step(step)
        out, rem = cached_attention(q, keys, values, self.parts, step, cache.ring)
        out = self.normaliser.finish(out, rem, v)
        return self.proj(out.transpose(1, 2).reshape(B, R, C))
