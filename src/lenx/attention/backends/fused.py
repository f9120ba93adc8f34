"""lenx's fused Triton kernels (lenx.ops), CUDA only, where a kernel covers the composition.

Covered (causal only): softmax + the DAPE V2 processor with or without a per-distance bias; softmax
+ a per-distance bias (alibi, kerple, kerple-power, t5) with no processor; stick-breaking with no
bias or processor (any remainder mode: the module applies it). Shapes the planner cannot see
(head dim when unknown, T) are checked again when the kernel is called. DAPE V2's forward-only work
goes to the Gluon forward on sm_90 where it covers the shape (`_use_gluon`), work that needs its
gradient to the skewed training kernels where their buffers fit (`_skewed_plan`), the rest to the
O(T)-memory Triton kernel.

Its memory is the default O(T) (Backend.memory): the skewed kernels take their T x T buffers only
where the device has them free when the step runs (`_skewed_plan`), so no step needs them.
"""

import importlib.util
import os

import torch

from ...ops._launch import HEAD_DIMS
from .base import Backend


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
        name = parts.normaliser.name
        if name == "stickbreaking":
            if parts.bias is not None or parts.processor is not None:
                return "the stick-breaking kernel takes no position bias and no score processor"
            return None
        if name != "softmax":
            return f"no fused Triton kernel for the {name} normaliser"
        bias, proc = parts.bias, parts.processor
        if bias is not None and not bias.per_distance:
            return "the fused kernels take only a per-distance bias table (alibi, kerple, kerple-power, t5)"
        if proc is None:
            return "plain causal softmax: fused SDPA covers it" if bias is None else None
        if proc.op != "dape_v2":
            return f"no fused Triton kernel for the {type(proc).__name__} score processor"
        if proc.leak:
            return "the fused DAPE V2 kernel is leak-free only (leak=True is the dense/chunked experiment)"
        from ...ops.dape_v2.triton import shape_unsupported_reason

        # Through the bare op API the head dim is unknown here; the kernel checks it again when called.
        return shape_unsupported_reason(proc.num_heads, parts.head_dim or 16, proc.hidden, proc.kernel_size)

    def describe(self, parts):
        if parts.processor is not None and parts.normaliser.name == "softmax":
            return "training: skewed where its buffers fit, else triton; forward only: gluon on sm_90, else triton"
        return None

    def run(self, q, k, v, parts, chunk_size=256):
        if parts.normaliser.name == "stickbreaking":
            from ...ops.stickbreaking.triton import stickbreaking_triton

            return stickbreaking_triton(q, k, v, parts.normaliser.attend_current)
        table = parts.bias.table(q.shape[-2], q.device) if parts.bias is not None else None
        if parts.processor is not None:
            weights = parts.processor.conv_weights()
            kernel = parts.processor.kernel = _dape_v2_kernel(q, k, v, weights, table, parts.processor)
            if kernel == "gluon":
                from ...ops.dape_v2.gluon import dape_v2_gluon_forward

                return dape_v2_gluon_forward(q, k, v, *weights, table)[0], None
            if kernel.startswith("skewed"):
                from ...ops.dape_v2.skewed import dape_v2_skewed

                return dape_v2_skewed(q, k, v, *weights, table, keep=kernel == "skewed (keep)"), None
            from ...ops.dape_v2.triton import dape_v2_triton

            return dape_v2_triton(q, k, v, *weights, table), None
        from ...ops.biased_softmax.triton import biased_attention

        # a bias may let the kernel give its parameters their gradients more cheaply (Kerple, T5)
        return biased_attention(q, k, v, table, **parts.bias.fused_grad_args() if parts.bias is not None else {}), None


def forward_kernel(q, k, v, parts) -> str:
    """Which kernel this backend's run() would use for these operands ("gluon", "skewed" or "triton"),
    so that a benchmark can say what it timed (call it under the same grad mode as run())."""
    if parts.processor is None or parts.normaliser.name == "stickbreaking":
        return "triton"
    table = parts.bias.table(q.shape[-2], q.device) if parts.bias is not None else None
    return _dape_v2_kernel(q, k, v, parts.processor.conv_weights(), table, parts.processor).split(" ")[0]


def _dape_v2_kernel(q, k, v, weights, table, proc) -> str:
    """The kernel for DAPE V2 work: "gluon" (forward only, _use_gluon), "skewed (keep)" or "skewed
    (recompute)" (work that needs a gradient, where the buffers fit: _skewed_plan), else "triton"."""
    if _use_gluon(q, k, v, weights, table, proc):
        return "gluon"
    plan = _skewed_plan(q, k, v, weights, table)
    return "triton" if plan is None else f"skewed ({plan})"


def _needs_grad(operands) -> bool:
    return torch.is_grad_enabled() and any(x.requires_grad for x in operands)


def _skewed_plan(q, k, v, weights, table) -> str | None:
    """Work that needs DAPE V2's gradient goes to the skewed kernels (lenx.ops.dape_v2.skewed) where
    their T x T buffers fit in the device's free memory: "keep" (the forward keeps its two buffers
    for the backward) when six buffers fit, "recompute" when four do (the backward's peak), else
    None (the O(T)-memory Triton kernel, 10-11x slower at the 125m training shapes: notes/kernels.md).
    Forward-only work never takes them. LENX_DAPE_V2_SKEWED=0 keeps the Triton kernel, =keep or
    =recompute forces that mode."""
    mode = os.environ.get("LENX_DAPE_V2_SKEWED", "auto")
    operands = (q, k, v, *weights) + ((table,) if table is not None else ())
    if mode == "0" or not _needs_grad(operands):
        return None
    if mode in ("keep", "recompute"):
        return mode
    if q.device.type != "cuda":  # Triton's interpreter (the CPU tests)
        return "keep"
    from ...ops.dape_v2.skewed import buffer_bytes

    B, H, T, _ = q.shape
    need = buffer_bytes(B, H, T, q.dtype)
    hidden = buffer_bytes(B, H, T, q.dtype, channels=1 << max(0, weights[0].shape[0] - 1).bit_length())
    free = torch.cuda.mem_get_info(q.device)[0] + torch.cuda.memory_reserved(q.device) - torch.cuda.memory_allocated(q.device)
    if 6 * need + hidden <= free:
        return "keep"
    return "recompute" if 4 * need + hidden <= free else None


def _use_gluon(q, k, v, weights, table, proc) -> bool:
    """The DAPE V2 forward goes to the Gluon kernel (lenx.ops.dape_v2.gluon; on an H200 with its host
    tables 1.60-1.65x faster than the Triton one at k 3 and 1.01-1.12x at k 1, results/bench/
    h200_gluon_fwd_8warps) where nothing needs a gradient (it has no backward yet: evaluation,
    generation) and it covers the shape. LENX_DAPE_V2_GLUON=0 keeps the Triton kernel."""
    if os.environ.get("LENX_DAPE_V2_GLUON", "1") == "0":
        return False
    if _needs_grad((q, k, v, *weights) + ((table,) if table is not None else ())):
        return False
    from ...ops.dape_v2 import gluon

    return gluon.unsupported_reason(q, proc.num_heads, proc.hidden, proc.kernel_size) is None
