"""lenx's fused Triton kernels (lenx.ops), CUDA only, where a kernel covers the composition.

Covered (causal only): softmax + the DAPE V2 processor with or without a per-distance bias; softmax
+ a per-distance bias (alibi, kerple, kerple-power, t5) or FoX's bias with no processor; stick-breaking
with no bias or processor (any remainder mode: the module applies it). All take a window and document
segments, DAPE V2 on its O(T)-memory Triton kernel only (the Gluon forward and the skewed kernels
take no mask: `_route` sends masked DAPE V2 work past them). Shapes the planner cannot see
(head dim when unknown, T) are checked again when the kernel is called. DAPE V2's forward-only work
goes to the Gluon forward on sm_90 where it covers the shape (`_use_gluon`), work that needs its
gradient to the skewed training kernels where their buffers fit (`_skewed_plan`), the rest to the
O(T)-memory Triton kernel. A head dim that kernel cannot take (128) goes to the
skewed kernels, forward only included, where their buffers fit, else to the chunked reference.
Forward-only work reuses its host tables between calls with the same weights (ops.dape_v2.tables);
where those tables exceed the Gluon forward's fp16 range (gluon.range_reason: Kerple-power at T
2048) it goes to the skewed forward instead (the Triton kernel where its buffers do not fit), and
the processor's `kernel_note` says why.

A query temperature's factor per row (q_scale, folds_q_scale) rides on the biased-softmax and FoX
kernels' score scale: the attention module passes it with q unscaled, and no pass of its own scales q.

Its memory is the default O(T) (Backend.memory): the skewed kernels take their T x T buffers only
where the device has them free when the step runs (`_skewed_plan`), so no step needs them; the
chunked reference's where DAPE V2's head dim can fall back to it.
"""

import importlib.util
import os

import torch

from ...ops._launch import HEAD_DIMS
from . import skewed_memory
from .base import Backend
from .reference import Chunked, chunked_attention


class Fused(Backend):
    name = "triton"

    def unsupported(self, parts, device):
        if device.type != "cuda":
            return "the fused Triton kernels run on CUDA devices only"
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed"
        if not parts.causal:
            return "the fused Triton kernels are causal only"
        if parts.head_dim is not None and parts.head_dim not in HEAD_DIMS:
            return f"the fused Triton kernels take head dims 16, 32, 64 or 128, not {parts.head_dim}"
        if parts.key_dim not in (None, parts.head_dim):
            return f"the fused Triton kernels take q, k and v of one width, not q and k {parts.key_dim} wide (PoPE)"
        name = parts.normaliser.name
        if name == "stickbreaking":
            if parts.bias is not None or parts.processor is not None:
                return "the stick-breaking kernel takes no position bias and no score processor"
            return None
        if name != "softmax":
            return f"no fused Triton kernel for the {name} normaliser"
        bias, proc = parts.bias, parts.processor
        if bias is not None and bias.per_token:  # FoX's gates (the planner judges the unbound part)
            return "the fused FoX kernel takes no score processor" if proc is not None else None
        if bias is not None and not bias.per_distance:
            return "the fused kernels take only a per-distance bias table (alibi, kerple, kerple-power, t5) or FoX's"
        if proc is None:
            return "plain causal softmax: fused SDPA covers it" if bias is None else None
        if proc.op != "dape_v2":
            return f"no fused Triton kernel for the {type(proc).__name__} score processor"
        if proc.leak:
            return "the fused DAPE V2 kernel is leak-free only (leak=True is the dense/chunked experiment)"
        from ...ops.dape_v2.triton import conv_unsupported_reason

        # The head dim: the Triton kernel where it takes it, else the skewed kernels or the chunked
        # reference (_dape_v2_kernel); through the bare op API it is unknown here.
        return conv_unsupported_reason(proc.num_heads, proc.hidden, proc.kernel_size)

    def describe(self, parts):
        if parts.processor is not None and parts.normaliser.name == "softmax":
            return ("training: skewed where its buffers fit (kept, recomputed, or in batch slices; "
                    "LENX_DAPE_V2_MEMORY sets a budget), else triton; forward only: gluon on sm_90 (skewed where "
                    "the bias tables exceed its fp16 range), else triton; "
                    "head dim 128 (the triton kernel cannot take it): skewed where its buffers fit, else chunked; "
                    "a window or documents: triton (chunked at head dim 128, or fp32 inputs past k 3 or d 32)")
        return None

    def memory(self, parts, work):
        # DAPE V2 at a head dim the O(T) kernel cannot take falls back to the chunked reference
        # where the skewed buffers do not fit (_dape_v2_kernel): its memory is then the chunked one
        if parts.processor is not None and parts.processor.op == "dape_v2" and _wide(parts.processor, work.head_dim, torch.float32 if work.itemsize == 4 else None):
            return Chunked().memory(parts, work)
        return super().memory(parts, work)

    def folds_q_scale(self, parts):
        # the biased-softmax and FoX kernels scale each row's scores (the DAPE V2 and stick-breaking
        # kernels take none)
        return parts.normaliser.name == "softmax" and parts.processor is None

    def run(self, q, k, v, parts, chunk_size=256, segments=None, q_scale=None):
        if q_scale is not None and not self.folds_q_scale(parts):
            raise ValueError("q_scale goes to the biased-softmax and FoX kernels only")
        if parts.normaliser.name == "stickbreaking":
            from ...ops.stickbreaking.triton import stickbreaking_triton

            return stickbreaking_triton(q, k, v, parts.normaliser.attend_current, window=parts.window,
                                        segments=segments)
        if parts.processor is not None:
            return _dape_v2(q, k, v, parts, chunk_size, segments)
        c = parts.bias.token_values() if parts.bias is not None else None
        common = dict(window=parts.window, segments=segments, q_scale=q_scale)
        if c is not None:  # FoX, bound to one forward's prefix sums
            from ...ops.forgetting.triton import forgetting_attention

            return forgetting_attention(q, k, v, c.float(), **common), None
        from ...ops.biased_softmax.triton import biased_attention

        if parts.bias is None:
            return biased_attention(q, k, v, None, **common), None
        # a bias may let the kernel give its parameters their gradients more cheaply (Kerple, T5);
        # only a backward reads them
        grad_args = parts.bias.fused_grad_args() if torch.is_grad_enabled() else {}
        bands = _kept_bands(q, parts.bias, grad_args)
        table = parts.bias.table(q.shape[-2], q.device) if bands is None else None
        if bands is not None:  # T5's shortcut for its table gradient: a kept table gets none
            grad_args = {name: arg for name, arg in grad_args.items() if name != "tail"}
        return biased_attention(q, k, v, table, **grad_args, **common, bands=bands), None


def _kept_bands(q, bias, grad_args):
    """The bias table's bands kept between calls (ops.biased_softmax.bands) where the table gets no
    gradient through the kernels: Kerple's parameters get theirs from the kernel (grad_args), and a
    bias with nothing to train needs none; else None (the table is built in the autograd graph)."""
    from ...ops.biased_softmax.band import tile_config
    from ...ops.biased_softmax.bands import cached_bands

    sources = [*bias.parameters(), *bias.buffers()]
    if "kerple" not in grad_args and _needs_grad(sources):
        return None
    T = q.shape[-2]
    res16 = tile_config(q.dtype, q.shape[-1])["band"][0] == "fp16"
    return cached_bands(bias, sources, lambda: bias.table(T, q.device), T, res16, q.device)


def _sources(parts):
    """The leaf tensors DAPE V2's host tables derive from: the conv weights, the bias's parameters
    and buffers (its table is built from them on every call)."""
    bias = [*parts.bias.parameters(), *parts.bias.buffers()] if parts.bias is not None else []
    return [*parts.processor.conv_weights(), *bias]


def _table(parts, T, device):
    return parts.bias.table(T, device) if parts.bias is not None else None


def _gluon_operands(q, parts):
    """The Gluon forward's host operands (gluon.prepare) and gluon.range_reason for them, cached
    (tables.cached) between calls with the same weights."""
    from ...ops.dape_v2 import gluon
    from ...ops.dape_v2.tables import cached

    w1, b1, w2, b2 = parts.processor.conv_weights()
    B, H, T, _ = q.shape

    def build():
        prepared = gluon.prepare(w1, b1, w2, b2, _table(parts, T, q.device), T, H, q.device)
        return prepared, gluon.range_reason(prepared[2], prepared[3], w2)

    return cached(_sources(parts), ("gluon", id(parts.bias), T, q.device), build)


def _route(q, k, v, parts):
    """(the kernel for this DAPE V2 work, the Gluon operands where it is "gluon"); sets the
    processor's kernel_note where the tables keep forward-only work off the Gluon forward, or a mask
    keeps any work off the Gluon and skewed kernels (they take no window or documents: only the
    O(T)-memory Triton kernel does, and the chunked reference where that cannot take the head dim)."""
    proc = parts.processor
    grad = _needs_grad((q, k, v, *_sources(parts)))
    proc.kernel_note = None
    if parts.masked:
        proc.kernel_note = f"{parts.masked}: the Gluon forward and the skewed kernels take no mask"
        return ("chunked" if _wide(proc, q.shape[-1], q.dtype) else "triton"), None
    if not grad and _use_gluon(q, proc):
        prepared, reason = _gluon_operands(q, parts)
        if reason is None:
            return "gluon", prepared
        proc.kernel_note = f"not the Gluon forward: {reason}"
        return _dape_v2_kernel(q, proc, grad, gluon=False), None
    return _dape_v2_kernel(q, proc, grad), None


def _dape_v2(q, k, v, parts, chunk_size, segments=None):
    from ...ops.dape_v2.tables import cached

    proc = parts.processor
    weights = proc.conv_weights()
    sources = _sources(parts)
    B, H, T, _ = q.shape
    key = (id(parts.bias), T, q.device)

    def table():
        return _table(parts, T, q.device)

    kernel, prepared = _route(q, k, v, parts)
    proc.kernel = kernel
    if kernel == "gluon":  # forward only: its host operands cached (tables.cached) between calls
        from ...ops.dape_v2 import gluon

        return _gluon_forward(q, k, v, proc, weights, prepared), None
    if kernel.startswith("skewed"):
        from ...ops.dape_v2 import skewed

        tab = table()
        tables = cached(sources, ("skewed",) + key, lambda: skewed.host_tables(*weights, tab, T))
        # F's residual from the tables (a large bias). Training: without a host sync after the first
        # call (its weights move by optimizer steps only); forward only: decided afresh each call
        residual = None
        if kernel != "skewed (forward)":
            switch = proc.__dict__.setdefault("residual_switch", skewed.ResidualSwitch())
            residual = switch.decide(tables[0], weights[2], q.dtype)
        keep = kernel == "skewed (keep)"
        size = _batch_slice(kernel, B)
        outs = [skewed.dape_v2_skewed(qs, ks, vs, *weights, tab, keep=keep, tables=tables, residual=residual)
                for qs, ks, vs in zip(q.split(size), k.split(size), v.split(size))]
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        if keep and out.grad_fn is not None:  # its S and F buffers stay until its backward (skewed_memory)
            skewed_memory.KEPT.add(out.grad_fn, _kept_bytes(q, proc.hidden))
        return out, None
    if kernel == "chunked":
        return chunked_attention(q, k, v, parts, chunk_size, segments)
    from ...ops.dape_v2.triton import dape_v2_triton

    return dape_v2_triton(q, k, v, *weights, table(), window=parts.window, segments=segments), None


def forward_kernel(q, k, v, parts) -> str:
    """Which kernel this backend's run() would use for these operands ("gluon", "skewed", "triton" or
    "chunked"), so that a benchmark can say what it timed (call it under the same grad mode as run();
    the processor's kernel_note then says why forward-only work is not on the Gluon forward; parts.segments
    must say whether document ids come, as for run())."""
    if parts.processor is None or parts.normaliser.name == "stickbreaking":
        return "triton"
    return _route(q, k, v, parts)[0].split(" ")[0]


def _dape_v2_kernel(q, proc, grad: bool, gluon: bool = True) -> str:
    """The kernel for DAPE V2 work: "gluon" (forward only, _use_gluon; gluon=False: its tables are out
    of its range, _route), "skewed (keep)", "skewed (recompute)" or "skewed (forward)" (where the
    buffers fit: _skewed_plan), else "triton" (the O(T)-memory kernel), or "chunked" (the reference
    in blocks of rows) where that kernel cannot take the head dim (_wide)."""
    if gluon and not grad and _use_gluon(q, proc):
        return "gluon"
    wide = _wide(proc, q.shape[-1], q.dtype)
    plan = _skewed_plan(q, proc.hidden, grad, wide or not gluon)
    if plan is not None:
        return f"skewed ({plan})"
    return "chunked" if wide else "triton"


def _wide(proc, head_dim, dtype=None) -> bool:
    """Whether the O(T) Triton kernel cannot take this head dim (it holds a q tile for every head, at
    least 16 slots: 128 is too wide) or, with fp32 inputs, this kernel size or head dim (its shared
    memory), while the skewed kernels, one head at a time, can."""
    from ...ops.dape_v2.triton import shape_unsupported_reason

    return head_dim is not None and shape_unsupported_reason(proc.num_heads, head_dim, proc.hidden,
                                                            proc.kernel_size, dtype=dtype) is not None


def _needs_grad(operands) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in operands)


def _skewed_plan(q, hidden: int, grad: bool, forward: bool) -> str | None:
    """Work that needs DAPE V2's gradient goes to the skewed kernels (lenx.ops.dape_v2.skewed) where
    their T x T buffers fit (skewed_memory.plan: the device's free memory, and LENX_DAPE_V2_MEMORY's
    budget where set): "keep" (the forward keeps its S and F buffers for the backward), "recompute"
    (the backward's four buffers and the hidden one), "recompute, batch slices of N" (the batch
    run N entries at a time, so that one slice's buffers fit), else None (the O(T)-memory Triton
    kernel, 10-11x slower at the 125m training shapes: notes/kernels.md). Forward-only work takes
    them ("forward", three buffers) only where `forward` says so: a head dim the Triton kernel
    cannot take, or tables out of the Gluon forward's range (else it is the Gluon or Triton
    forward's). LENX_DAPE_V2_SKEWED=0 keeps the Triton kernel (or the chunked reference where it
    cannot run), =keep or =recompute forces that mode."""
    mode = skewed_choice()
    if mode == "0" or not (grad or forward):
        return None
    if grad and mode in ("keep", "recompute"):
        return mode
    budget = skewed_memory.budget_bytes() if grad else None
    if q.device.type != "cuda":  # Triton's interpreter (the CPU tests): no device memory to ask
        if not grad:
            return "forward"
        return "keep" if budget is None else _budget_plan(q, hidden, budget, free=1 << 62)
    free = torch.cuda.mem_get_info(q.device)[0] + torch.cuda.memory_reserved(q.device) - torch.cuda.memory_allocated(q.device)
    return _budget_plan(q, hidden, budget, free) if grad else _forward_plan(q, hidden, free)


def _buffers(q, hidden: int) -> tuple[int, int]:
    """Bytes of one score-shaped skewed buffer and of the hidden one (skewed.buffer_bytes)."""
    from ...ops.dape_v2.skewed import buffer_bytes

    B, H, T, _ = q.shape
    return (buffer_bytes(B, H, T, q.dtype),
            buffer_bytes(B, H, T, q.dtype, channels=max(16, 1 << max(0, hidden - 1).bit_length())))


def _kept_bytes(q, hidden: int) -> int:
    """Bytes a layer that keeps its buffers holds until its backward: the S and F buffers."""
    return 2 * _buffers(q, hidden)[0]


def _forward_plan(q, hidden: int, free: int) -> str | None:
    need, hid = _buffers(q, hidden)
    return "forward" if 2 * need + hid <= free else None


def _budget_plan(q, hidden: int, budget, free: int) -> str | None:
    need, hid = _buffers(q, hidden)
    B = q.shape[0]
    mode, size = skewed_memory.plan(B, _kept_bytes(q, hidden), 4 * need + hid, skewed_memory.KEPT.total, free, budget)
    if mode == "recompute" and size < B:
        return f"recompute, batch slices of {size}"
    return mode


def _batch_slice(kernel: str, batch: int) -> int:
    """The batch slice of a skewed kernel name (_skewed_plan's "recompute, batch slices of N"), else
    the whole batch."""
    tail = kernel.rsplit(" slices of ", 1)
    return int(tail[1].rstrip(")")) if len(tail) == 2 else batch


def _use_gluon(q, proc) -> bool:
    """The DAPE V2 forward goes to the Gluon kernel (lenx.ops.dape_v2.gluon; on an H200 with its host
    tables 1.60-1.65x faster than the Triton one at k 3 and 1.01-1.12x at k 1, results/bench/
    h200_gluon_fwd_8warps) where nothing needs a gradient (it has no backward yet: evaluation,
    generation) and it covers the shape (_gluon_forward picks which Gluon kernel). LENX_DAPE_V2_GLUON=0 keeps
    the Triton kernel."""
    if gluon_choice() == "0":
        return False
    from ...ops.dape_v2 import gluon

    return gluon.unsupported_reason(q, proc.num_heads, proc.hidden, proc.kernel_size) is None


GLUON_CHOICES = ("ws", "1", "chain", "gluon", "0")


SKEWED_CHOICES = ("auto", "0", "keep", "recompute")


def skewed_choice() -> str:
    """LENX_DAPE_V2_SKEWED: "auto" (the default: _skewed_plan decides), "0", "keep" or "recompute"."""
    value = os.environ.get("LENX_DAPE_V2_SKEWED", "auto")
    if value not in SKEWED_CHOICES:
        raise ValueError(f"LENX_DAPE_V2_SKEWED must be one of {', '.join(SKEWED_CHOICES)}, got {value!r}")
    return value


def check_settings() -> None:
    """A ValueError of one line for an environment setting of this backend that names nothing
    (LENX_DAPE_V2_GLUON, LENX_DAPE_V2_SKEWED, LENX_DAPE_V2_MEMORY), so the CLI stops before any work."""
    gluon_choice()
    skewed_choice()
    skewed_memory.budget_bytes()


def gluon_choice() -> str:
    """LENX_DAPE_V2_GLUON: "ws" (the default; "1" says the same), "chain", "gluon" or "0" (no Gluon)."""
    value = os.environ.get("LENX_DAPE_V2_GLUON", "ws")
    if value not in GLUON_CHOICES:
        raise ValueError(f"LENX_DAPE_V2_GLUON must be one of {', '.join(GLUON_CHOICES)}, got {value!r}")
    return value


def _gluon_forward(q, k, v, proc, weights, prepared):
    """The Gluon forward's output: the warp-specialised chain (lenx.ops.dape_v2.chain_ws) where it takes
    the shape (H <= 12), else gluon.py's kernel; both read the same host operands (gluon.prepare). On
    an H200 the chain_ws runs 4.05 ms at T 8192 against gluon.py's 6.28 (results/bench/h200_land_78053f5).
    LENX_DAPE_V2_GLUON picks one for timing: `gluon` (gluon.py), `chain` (chain.py), `ws` (chain_ws)."""
    from ...ops.dape_v2 import chain, chain_ws, gluon

    pick = gluon_choice()
    if pick != "gluon" and \
            chain.unsupported_reason(q, proc.num_heads, proc.hidden, proc.kernel_size) is None:
        if pick == "chain":
            proc.kernel = "gluon (chain)"
            return chain.dape_v2_chain_forward(q, k, v, *weights, prepared=prepared)[0]
        proc.kernel = "gluon (chain_ws)"
        return chain_ws.dape_v2_chain_ws_forward(q, k, v, *weights, prepared=prepared)[0]
    return gluon.dape_v2_gluon_forward(q, k, v, *weights, prepared=prepared)[0]
