"""Ways to compute one attention composition, and the planner that picks among them.

Each backend is one object (base.Backend) that says why it cannot run a composition and how to run
it. REGISTRY is the planner's order of preference: the first backend that can run a composition
and may be picked automatically on the device wins, but a masked composition tries flex before sdpa
(a block mask skips the tiles a window or a document hides; SDPA reads a dense boolean mask and
every tile: on one H200, plain softmax with 8 documents, fwd+bwd at 8192 took 0.82 ms on flex and
3.72 on SDPA, at 32768 1.70 and 57.2; results/bench/h200_masks_fd98528). Adding a backend: one file
and one entry here.

triton   lenx's fused kernels (lenx.ops), CUDA only, where a kernel covers the composition (masks: all;
         DAPE V2's on its O(T)-memory kernel, never the Gluon or skewed ones: fused._route)
sdpa     fused torch scaled_dot_product_attention: softmax with no bias and no processor (a window or
         document mask as a boolean mask)
flex     FlexAttention with a per-distance bias table and/or a window or document block mask
         (automatic on CUDA only)
chunked  the reference per block of query rows: everything, in O(T) memory
dense    the reference: the whole [B, H, T, T] score map (only when asked for)
"""

from dataclasses import replace

import torch

from ..parts import Parts
from .base import Backend, LayerMemory, Work
from .flex import Flex
from .fused import Fused
from .reference import Chunked, Dense, block_attention, chunked_attention, dense_attention, score_block, score_maps
from .sdpa import Sdpa

REGISTRY: tuple[Backend, ...] = (Fused(), Sdpa(), Flex(), Chunked(), Dense())
BACKENDS = tuple(b.name for b in REGISTRY)
_BY_NAME = {b.name: b for b in REGISTRY}


def get_backend(name: str) -> Backend:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of auto, {', '.join(BACKENDS)}") from None


# Backends whose kernels take no window or document mask, with the reason, judged here and not in their
# files. None at present: every backend takes both (the fused kernels' DAPE V2 work, masked, on its
# O(T)-memory kernel only: fused._route).
NO_MASKS: dict[str, str] = {}


def _takes_masks(backend: str) -> bool:
    return backend not in NO_MASKS


def _unsupported(backend: Backend, parts: Parts, device: torch.device) -> str | None:
    reason = backend.unsupported(parts, device)
    if reason is None and parts.masked and not _takes_masks(backend.name):
        return f"{NO_MASKS[backend.name]} ({parts.masked}); backend auto runs it on one that does"
    return reason


def unsupported_reason(backend: str, parts: Parts, device: torch.device) -> str | None:
    """Why `backend` cannot compute this composition on `device`, or None if it can."""
    return _unsupported(get_backend(backend), parts, device)


def _order(parts: Parts) -> tuple[Backend, ...]:
    if not parts.masked:
        return REGISTRY
    flex = _BY_NAME["flex"]
    return tuple(b for b in REGISTRY if b is not flex)[:1] + (flex,) + tuple(b for b in REGISTRY[1:] if b is not flex)


def plan_backend(parts: Parts, device: torch.device, requested: str = "auto") -> str:
    """The first backend of REGISTRY (masked: flex before sdpa) that runs this composition on
    `device` and may be picked automatically there, or the requested one (an error that lists the usable ones if it cannot)."""
    if requested != "auto":
        reason = unsupported_reason(requested, parts, device)
        if reason:
            ok = [b.name for b in REGISTRY if _unsupported(b, parts, device) is None]
            raise ValueError(f"backend {requested!r} cannot run this attention: {reason}. Usable here: {', '.join(ok)}")
        return requested
    for backend in _order(parts):
        if backend.auto(device) and _unsupported(backend, parts, device) is None:
            return backend.name
    raise AssertionError("the chunked reference runs every composition")


def run_backend(backend: str, q, k, v, parts: Parts, chunk_size: int = 256, segments=None, q_scale=None):
    """(out [B, H, T, d], rem [B, H, T] or None) of the named backend; segments [B, T] the
    document ids (None: one document; parts.segments must say whether they come). q_scale: a factor
    per query row (broadcasting to [B, H, T]) that the backend's kernels apply to q's scores, where
    it folds one (Backend.folds_q_scale; an error elsewhere)."""
    if (segments is not None) != parts.segments:
        raise ValueError("segments given without parts.segments (or the reverse): the plan would not know of them")
    if parts.masked and not _takes_masks(backend):  # its kernels would ignore the mask
        raise ValueError(unsupported_reason(backend, parts, q.device) or NO_MASKS[backend])
    if q_scale is None:
        return get_backend(backend).run(q, k, v, parts, chunk_size, segments)
    if not get_backend(backend).folds_q_scale(parts):
        raise ValueError(f"backend {backend!r} takes no q_scale for this attention: scale q before it")
    return get_backend(backend).run(q, k, v, parts, chunk_size, segments, q_scale=q_scale)


def plan_note(parts: Parts, device: torch.device, requested: str = "auto") -> str | None:
    """Why the plan for `parts` is not the fused kernels where they would otherwise run it: a window
    or document mask they do not take (NO_MASKS; none at present), else None. A run's meta.json and
    `lenx bench --train-step` record it."""
    if parts.masked is None or requested not in ("auto", "triton"):
        return None
    if unsupported_reason("triton", replace(parts, window=0, segments=False), device) is not None:
        return None
    if _takes_masks("triton"):
        return None
    chosen = plan_backend(parts, device, "auto")
    return f"{chosen}, not triton: {NO_MASKS['triton']} ({parts.masked})"


__all__ = ["BACKENDS", "REGISTRY", "Backend", "LayerMemory", "Parts", "Work", "get_backend", "unsupported_reason",
           "plan_backend", "plan_note", "run_backend", "score_block", "score_maps", "block_attention", "dense_attention", "chunked_attention"]
