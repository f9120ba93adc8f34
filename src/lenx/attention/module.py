"""The one attention module: a q/k transform, a score bias, a score processor and a normaliser,
built from the method registry (methods.py)."""

import torch
from torch import nn

from ..config import AttentionConfig
from . import profiling
from .backends import block_attention, plan_backend, run_backend
from .cache import LayerCache
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
        self.parts = Parts(self.bias, self.processor, self.normaliser, cfg.causal, self.head_dim)
        # Fail at construction, not at the first forward, when a forced backend cannot run this
        # composition (triton is judged for CUDA, the only device it runs on).
        plan_backend(self.parts, torch.device("cuda" if cfg.backend == "triton" else "cpu"), cfg.backend)

    def backend_for(self, device: torch.device) -> str:
        return plan_backend(self.parts, device, self.cfg.backend)

    def project(self, x: torch.Tensor, positions: torch.Tensor | None = None, length: int | None = None):
        """x [B, T, C] -> q, k, v [B, H, T, d], q and k already rotated when the base is RoPE (at
        `positions`, default 0..T-1; `length`, default T, sets a scaled RoPE's auto factor)."""
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.rope is not None:
            q, k = self.rope(q, k, torch.arange(T, device=x.device) if positions is None else positions, length)
        return q, k, v

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:
        """x [B, T, C] at positions 0..T-1. With a cache (a prefill), their keys and values are kept
        (a scaled RoPE then takes its auto factor from the cache's capacity, as decoding does)."""
        B, T, C = x.shape
        q, k, v = self.project(x, length=None if cache is None else cache.capacity)
        if cache is not None:
            cache.write(0, k, v)
        if profiling.active():  # `lenx bench --train-step`: attention's kernels marked for torch.profiler
            out = profiling.marked(self.attend, q, k, v)
        else:
            out = self.attend(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(B, T, C))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention itself: q, k, v [B, H, T, d] (q and k already rotated) -> out [B, H, T, d]."""
        out, rem = run_backend(self.backend_for(q.device), q, k, v, self.parts, self.cfg.chunk_size)
        return self.normaliser.finish(out, rem, v)

    def extend(self, x: torch.Tensor, cache: LayerCache, start: int) -> torch.Tensor:
        """Rows x [B, R, C] at positions start..start+R-1 against the cached keys and values of the
        positions before them: writes the rows' keys and values into the cache and returns their
        outputs [B, R, C], the rows of a forward over positions 0..start+R-1. The rows are
        processed as one block of the reference path: O(R T) work, never a [T, T] map."""
        B, R, C = x.shape
        q, k, v = self.project(x, torch.arange(start, start + R, device=x.device), cache.capacity)
        cache.write(start, k, v)
        keys, values = cache.read(start + R)
        out, rem = block_attention(q, keys, values, self.parts, start)
        out = self.normaliser.finish(out, rem, v)
        return self.proj(out.transpose(1, 2).reshape(B, R, C))
