"""Attention operators with several implementations each: a dense fp32 reference, a chunked
PyTorch path, and (on CUDA) fused Triton kernels."""

import torch

from ..attention.backends import Parts, chunked_attention, dense_attention, plan_backend, run_backend
from .stickbreaking.reference import stickbreaking_reference


def triton_unsupported_reason(parts: Parts, device: torch.device) -> str | None:
    """Fused kernels are not part of this build yet."""
    return "no fused Triton kernel covers this composition"


def triton_attention(q, k, v, parts: Parts):
    raise NotImplementedError("no fused Triton kernel covers this composition")


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
