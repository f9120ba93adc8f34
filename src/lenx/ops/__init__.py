"""Attention operators with several implementations each: a dense fp32 reference, a chunked
PyTorch path, and (on CUDA) fused Triton kernels."""

import importlib.util

import torch

from ..attention.backends import Parts, chunked_attention, dense_attention, plan_backend, run_backend
from .stickbreaking.reference import stickbreaking_reference


def triton_unsupported_reason(parts: Parts, device: torch.device) -> str | None:
    """Why no fused Triton kernel computes this composition on `device`, or None if one does.

    Covered (causal only): softmax + DAPE V2 with or without a per-distance bias; softmax + a
    per-distance bias (alibi, kerple, kerple-power, t5) with no processor; stick-breaking with no
    bias or processor (any remainder mode: the module applies it). Shapes the planner cannot see
    (head dim, T) are checked when the kernel is called."""
    if device.type != "cuda":
        return "the fused Triton kernels run on CUDA devices only"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if not parts.causal:
        return "the fused Triton kernels are causal only"
    if parts.head_dim is not None and parts.head_dim not in (16, 32, 64, 128):
        return f"the fused Triton kernels take head dims 16, 32, 64 or 128, not {parts.head_dim}"
    name = parts.normaliser.name
    if name == "stickbreaking":
        if parts.bias is not None or parts.processor is not None:
            return "the stick-breaking kernel takes no position bias and no score processor"
        return None
    if name != "softmax":
        return f"no fused Triton kernel for the {name} normaliser"
    bias, proc = parts.bias, parts.processor
    if bias is not None and not (getattr(bias, "pointwise", False) and hasattr(bias, "table")):
        return "the fused kernels take only a per-distance bias table (alibi, kerple, kerple-power, t5)"
    if proc is None:
        if bias is None:
            return "plain causal softmax: fused SDPA covers it"
        return None
    from ..attention.dape import DapeV2

    if not isinstance(proc, DapeV2):
        return f"no fused Triton kernel for the {type(proc).__name__} score processor"
    if proc.leak:
        return "the fused DAPE V2 kernel is leak-free only (leak=True is the dense/chunked experiment)"
    from .dape_v2.triton import shape_unsupported_reason

    # Through the bare op API the head dim is unknown here; the kernel checks it again when called.
    return shape_unsupported_reason(proc.num_heads, parts.head_dim or 16, proc.hidden, proc.kernel_size)


def triton_attention(q, k, v, parts: Parts):
    """Run the fused kernel for `parts` (see triton_unsupported_reason) -> (out, rem or None).
    q and k arrive already rotated (RoPE is applied by the caller)."""
    T = q.shape[-2]
    if parts.normaliser.name == "stickbreaking":
        from .stickbreaking.triton import stickbreaking_triton

        return stickbreaking_triton(q, k, v, parts.normaliser.attend_current)
    table = parts.bias.table(T, q.device) if parts.bias is not None else None
    if parts.processor is not None:
        from .dape_v2.triton import dape_v2_triton

        return dape_v2_triton(q, k, v, parts.processor, table), None
    from .dape_v2.biased import biased_attention

    # a bias may let the kernel give its parameters their gradients more cheaply (Kerple, T5)
    extra = getattr(parts.bias, "fused_grad_args", dict)()
    return biased_attention(q, k, v, table, **extra), None


def stickbreaking_attention(q, k, v, attend_current: bool = False, backend: str = "auto", chunk_size: int = 256):
    """Stick-breaking attention, q, k, v [B, H, T, d], scale 1/sqrt(d) -> (out, rem):
    out_i = sum_j A_ij v_j, rem_i = 1 - sum_j A_ij (no remainder is added to out)."""
    from ..attention.stickbreaking import StickBreaking

    parts = Parts(None, None, None, StickBreaking(q.shape[1], q.shape[-1], attend_current, remainder="drop"))
    backend = plan_backend(parts, q.device, backend)
    return run_backend(backend, q, k, v, parts, chunk_size)


def dape_v2_attention(q, k, v, processor, bias=None, backend: str = "auto", chunk_size: int = 256):
    """Causal softmax attention over DAPE V2-processed scores: softmax(S + Bias + f(tril([S; Bias]))) V.

    q, k, v [B, H, T, d]; processor a lenx.attention.DapeV2; bias None or a tensor broadcastable to
    [B, H, T, T], or a position-bias module of lenx.attention (evaluated block by block)."""
    from ..attention.softmax import Softmax

    bias_part = None
    if isinstance(bias, torch.Tensor):
        full = bias

        def bias_part(q_pos, k_pos, q=None, k=None):  # noqa: E306  (a slice of the given map)
            return full[..., q_pos[0] : q_pos[-1] + 1, : len(k_pos)]
    elif bias is not None:
        bias_part = bias
    parts = Parts(None, bias_part, processor, Softmax())
    backend = plan_backend(parts, q.device, backend)
    out, _ = run_backend(backend, q, k, v, parts, chunk_size)
    return out


__all__ = ["stickbreaking_attention", "dape_v2_attention", "stickbreaking_reference", "dense_attention", "chunked_attention"]
