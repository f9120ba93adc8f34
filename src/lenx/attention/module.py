"""The one attention module: a q/k transform, a query temperature, a score bias, a score processor and
a normaliser, built from the method registry (methods.py)."""

from dataclasses import replace
import functools

import torch
from torch import nn

from ..config import AttentionConfig
from . import profiling
from .backends import get_backend, plan_backend, run_backend
from .cache import LayerCache, StepRows, cached_attention
from .fox import FoxPro
from .masks import check_segments, positions as document_positions
from .methods import BASES, NORMALISERS, PROCESSORS, TEMPERATURES, parse_method
from .parts import PartContext, Parts
from .rope import RoPE


class Attention(nn.Module):
    def __init__(self, cfg: AttentionConfig, n_head: int, d_model: int, shared: dict | None = None, layer: int = 0,
                 n_layer: int = 1):
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
                          spec.processor, layer=layer, n_layer=n_layer)
        base = BASES[spec.base]
        built = base.build(ctx) if base.role else None
        self.rope = built if base.role == "qk" else None  # RoPE or PoPE
        self.key_dim = self.rope.key_dim if self.rope is not None else self.head_dim  # q and k's width for the backends
        self.bias = built if base.role == "bias" else None
        self.pro = FoxPro.from_config(ctx)  # FoX's Pro options: None unless one is on (fox methods only)
        ctx.name = spec.temperature
        self.temperature = TEMPERATURES[spec.temperature].build(ctx) if spec.temperature else None
        ctx.has_bias = self.bias is not None
        if spec.processor:
            ctx.name = spec.processor
            self.processor = PROCESSORS[spec.processor].build(ctx)
        else:
            self.processor = built if base.role == "processor" else None
        ctx.name = spec.normaliser
        self.normaliser = NORMALISERS[spec.normaliser].build(ctx)
        self.parts = Parts(self.bias, self.processor, self.normaliser, cfg.causal, self.head_dim, self.key_dim,
                           cfg.window)
        # Fail at construction, not at the first forward, when a forced backend cannot run this
        # composition (triton is judged for CUDA, the only device it runs on).
        plan_backend(self.parts, torch.device("cuda" if cfg.backend == "triton" else "cpu"), cfg.backend)

    def backend_for(self, device: torch.device, segments: bool = False) -> str:
        """The backend for this layer on `device`, for a call with document ids when `segments`."""
        parts = replace(self.parts, segments=True) if segments else self.parts
        return plan_backend(parts, device, self.cfg.backend)

    def _qkv(self, x: torch.Tensor, split: bool = True):
        """The projection of x [B, T, C]: q, k, v stacked [3, B, H, T, d] (views), or as it is laid out,
        [B, T, 3, H, d] (split False)."""
        B, T, _ = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim)
        return qkv.permute(2, 0, 3, 1, 4) if split else qkv

    def project(self, x: torch.Tensor, positions: torch.Tensor | None = None, length=None, segments=None,
                memo: dict | None = None):
        """x [B, T, C] -> q, k, v [B, H, T, d], q and k already rotated when the base is RoPE or PoPE
        (at `positions`, default 0..T-1, or per sequence [B, T]; `length`, default T, or per sequence
        a tensor [B], sets a scaled RoPE's auto or dynamic factor; PoPE's q and k are 2d wide), then
        q scaled by the query temperature for the keys each row sees (position + 1: a document's
        own under segments, whose positions restart at each document). segments [B, T]: FoX's
        key/value shift takes nothing from the token before a document's first. memo: a dict the
        layers of one forward over the same tokens share (None: this call's own), which keeps the
        temperature's table for them all."""
        return self._project(x, positions, length, segments, memo)[:3]

    def _project(self, x, positions=None, length=None, segments=None, memo=None, to_kernel: bool = False):
        """project's q, k, v and None; to_kernel (the backend's kernels fold a temperature's factor,
        folds_temperature): q unscaled and the factor for the kernels (s_h's gradient flows through it)."""
        qkv = self._qkv(x, split=False)
        T = x.shape[1]

        def pos():
            return torch.arange(T, device=x.device) if positions is None else positions

        term = None
        if self.temperature is not None:
            dtype = torch.float64 if qkv.dtype == torch.float64 else torch.float32
            key = ("temperature", self.temperature.settings, self.cfg.causal, self.cfg.window, dtype)
            memo = {} if memo is None else memo
            if key not in memo:  # a causal row sees position + 1 keys (at most its window), a bidirectional one all T
                memo[key] = self.temperature.position_term(
                    self._keys_seen(pos() + 1) if self.cfg.causal else torch.full_like(pos(), T), dtype)
            term = memo[key]
        # RoPE's fused kernel scales q's rows as it rotates them: the temperature then costs no pass of its own
        fold = term is not None and isinstance(self.rope, RoPE) and self.rope.fuses(qkv)
        if self.rope is not None:  # from the projection's output as it is (FoX's Pro, below, has no RoPE)
            # SDPA's output takes q's layout: q and k in [B, T, H, d] memory give an output that the
            # output projection reads with no copy
            heads_last = self.backend_for(x.device, segments is not None) == "sdpa"
            if fold:
                q, k, v = self.rope.project(qkv, positions, length, heads_last, self.temperature.factor(term))
            else:
                q, k, v = self.rope.project(qkv, positions, length, heads_last)
        else:
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
        if self.pro is not None:  # the key/value shift and the QK-norm
            real = None
            if segments is not None:  # a document's last token shifts nothing into the next document's first
                real = torch.ones_like(segments, dtype=torch.bool)
                real[:, :-1] = segments[:, 1:] == segments[:, :-1]
                real = real[:, None, :, None]
            q, k, v = self.pro(x, q, k, v, None, real)
        if term is not None and to_kernel and not fold:  # q unscaled; the kernels give s_h its gradient
            return q, k, v, self.temperature.factor(term, grad=True)
        if term is not None:
            q = self.temperature(q, term=term, folded=fold)
        return q, k, v, None

    def folds_temperature(self, device: torch.device, segments: bool = False) -> bool:
        """Whether this layer's query temperature rides on its backend's kernels (the fused
        biased-softmax and FoX kernels scale each row's scores: no pass of its own scales q), for a
        forward on `device` (with document ids when `segments`). Not under torch.compile, whose
        inductor fuses the plain product."""
        return self.temperature is not None and not torch.compiler.is_compiling() \
            and get_backend(self.backend_for(device, segments)).folds_q_scale(self.parts)

    def _keys_seen(self, counts: torch.Tensor) -> torch.Tensor:
        """The keys a causal row sees from its position + 1: at most its window's."""
        return counts.clamp(max=self.cfg.window) if self.cfg.window else counts

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None, rows: list[int] | None = None,
                at: int = 0, segments: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, memo: dict | None = None) -> torch.Tensor:
        """x [B, T, C] at positions 0..T-1; segments [B, T] their document ids (None: one document;
        no row attends across a document boundary), each token then at its position in its
        document (`positions` [B, T], default masks.positions(segments); see masks.py). With a
        cache (a prefill), their keys and values go to its slots at..at+T-1 of the sequences
        `rows` (None: all). memo: see project."""
        B, T, C = x.shape
        check_segments(segments, B, T)
        if cache is not None and segments is not None:
            raise ValueError("decoding has no document segments: a prompt is one document")
        if segments is not None and positions is None:
            positions = document_positions(segments)
        to_kernel = cache is None and self.folds_temperature(x.device, segments is not None)
        q, k, v, q_scale = self._project(x, positions, segments=segments, memo=memo, to_kernel=to_kernel)
        parts, kept = self.parts_for(x)
        if positions is not None and parts.bias is not None:
            parts = replace(parts, bias=parts.bias.at(positions))
        if cache is not None:
            cache.write(at, k, v, rows, q, **kept)
        attend = functools.partial(self.attend, parts=parts, segments=segments, q_scale=q_scale)
        if profiling.active():  # `lenx bench --train-step`: attention's kernels marked for torch.profiler
            out = profiling.marked(attend, q, k, v)
        else:
            out = attend(q, k, v)
        return self._output(out, x)

    def parts_for(self, x: torch.Tensor):
        """The parts that run on the input x [B, T, C] at positions 0..T-1, a per-token bias (FoX's)
        bound to it, and what a KV cache keeps of x per slot beside K and V (see cache_extra)."""
        if self.bias is None or not self.bias.per_token:
            return self.parts, {}
        c = self.bias.prefix_sums(x)
        kept = {"c": c.transpose(1, 2)}
        if self.pro is not None and self.pro.kv_shift:
            kept["x"] = x  # the next token's shift projects this one's key and value again
        return replace(self.parts, bias=self.bias.bind(c)), kept

    def cache_extra(self, dtype: torch.dtype) -> dict:
        """What this layer's KV cache keeps per slot beside K and V (LayerCache's extra): FoX's prefix
        sums c, and the input x under the key/value shift."""
        extra = {}
        if self.bias is not None and self.bias.per_token:
            extra["c"] = ((self.n_head,), torch.promote_types(dtype, torch.float32))
        if self.pro is not None and self.pro.kv_shift:
            extra["x"] = ((self.n_head * self.head_dim,), dtype)
        return extra

    def _output(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The heads' outputs [B, H, T, d] of input x [B, T, C] -> the layer's output [B, T, C]."""
        if self.pro is not None:  # FoX's output norm and gate
            return self.proj(self.pro.gate(out, x))
        B, _, T, _ = out.shape
        return self.proj(out.transpose(1, 2).reshape(B, T, -1))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, parts: Parts | None = None,
               segments: torch.Tensor | None = None, q_scale: torch.Tensor | None = None) -> torch.Tensor:
        """The attention itself: q, k, v [B, H, T, d] (q and k already rotated) -> out [B, H, T, d].
        parts: self.parts, or those bound to the input (parts_for); segments [B, T] or None; q_scale:
        the temperature's factor per row for a backend that folds it (folds_temperature), q unscaled."""
        parts = self.parts if parts is None else parts
        if segments is not None:
            parts = replace(parts, segments=True)
        backend = self.backend_for(q.device, segments is not None)
        out, rem = run_backend(backend, q, k, v, parts, self.cfg.chunk_size, segments, q_scale)
        out = self.normaliser.finish(out, rem, v)
        return out if self.processor is None else self.processor.finish(out)

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
        qkv = self._qkv(x)
        q, k, v = qkv
        kept = {}
        if self.pro is not None or (self.bias is not None and self.bias.per_token):
            real = step.q_pos >= 0  # [B, R]: a padding row's gate and shift count nothing
        if self.pro is not None:
            prev = None
            if self.pro.kv_shift:  # the key and value of the slot before the rows, projected again
                prev = self._qkv(cache.before("x", step.rows[:1]))[1:]
                kept["x"] = torch.where(real[..., None], x, 0.0)
            q, k, v = self.pro(x, q, k, v, prev, real[:, None, :, None])
        if self.bias is not None and self.bias.per_token:  # FoX: the rows' c (consecutive slots) from the slot before
            log_f = torch.where(real[:, None, :], self.bias.log_forget(x), 0.0)
            c = cache.before("c", step.rows[:1]).transpose(1, 2) + log_f.cumsum(-1)
            kept["c"] = c.transpose(1, 2)
        if self.rope is not None:
            q, k = self.rope.step(qkv[:2] if self.pro is None else torch.stack((q, k)), step)
        if self.temperature is not None:  # the rows' key counts (one term for the step's layers of one window)
            dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
            term = step.shared(("temperature", self.temperature.settings, self.cfg.window, dtype),
                               lambda: self.temperature.position_term(self._keys_seen(step.q_pos + 1), dtype))
            q = self.temperature(q, term=term)
        cache.write_at(step.rows, k, v, q, **kept)
        keys, values = cache.read_step(step)
        parts = self.parts
        if "c" in kept:
            parts = replace(parts, bias=self.bias.bind(c, cache.read_extra("c", step).transpose(1, 2)))
        out, rem = cached_attention(q, keys, values, parts, step, cache.ring, cache.q)
        out = self.normaliser.finish(out, rem, v)
        return self._output(out if self.processor is None else self.processor.finish(out), x)
