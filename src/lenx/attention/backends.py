"""Ways to compute one attention composition, and the planner that picks among them.

dense    the reference: the whole [B, H, T, T] score map, straight from the formulas.
chunked  the same per block of query rows, keys cut at the block's causal edge (plus the DAPE V2
         halo); at most [B, H, chunk, T] live, and blocks are recomputed in backward.
sdpa     fused torch scaled_dot_product_attention: softmax with no bias and no processor.
flex     FlexAttention with a per-distance bias table: softmax, pointwise bias, no processor.
triton   lenx's fused kernels (lenx.ops), CUDA only, where a kernel covers the composition.
"""

from dataclasses import dataclass
import math

import torch
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from .cope import CoPE
from .dape import DapeV2

BACKENDS = ("triton", "sdpa", "flex", "chunked", "dense")
AUTO_ORDER = ("triton", "sdpa", "flex", "chunked")


@dataclass(frozen=True)
class Parts:
    """The four parts of one attention (the modules are owned by the attention layer)."""

    qk: object | None  # RoPE or None (applied by the caller before any backend)
    bias: object | None  # (q_pos, k_pos, q, k) -> broadcastable to [B, H, Tq, Tk]
    processor: object | None  # DapeV2 or CoPE
    normaliser: object  # Softmax or StickBreaking
    causal: bool = True
    head_dim: int | None = None  # lets the planner reject shapes a fused kernel cannot take


def score_block(q, k, parts: Parts, q_start: int = 0):
    """Pre-normaliser scores of rows q [B, H, c, d] (positions q_start..) against keys k [B, H, Tk, d]
    (positions 0..Tk-1). Returns (raw scaled scores, bias or None, processed scores A)."""
    q_pos = torch.arange(q_start, q_start + q.shape[-2], device=q.device)
    k_pos = torch.arange(k.shape[-2], device=q.device)
    raw = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    bias = parts.bias(q_pos, k_pos, q=q, k=k) if parts.bias is not None else None
    if isinstance(parts.processor, DapeV2):
        return raw, bias, parts.processor(raw, bias, q_offset=q_start)
    scores = raw if bias is None else raw + bias.to(raw.dtype)
    if isinstance(parts.processor, CoPE):
        scores = parts.processor(scores, q, q_pos, k_pos)
    return raw, bias, scores


def block_attention(q, k, v, parts: Parts, q_start: int = 0):
    """Rows q [B, H, c, d] at positions q_start.., keys/values [B, H, Tk, d] at 0..Tk-1.
    Returns (out [B, H, c, d], rem [B, H, c] or None)."""
    _, _, scores = score_block(q, k, parts, q_start)
    q_pos = torch.arange(q_start, q_start + q.shape[-2], device=q.device)
    k_pos = torch.arange(k.shape[-2], device=q.device)
    return parts.normaliser(scores, v, parts.normaliser.allowed(q_pos, k_pos, parts.causal))


def dense_attention(q, k, v, parts: Parts):
    return block_attention(q, k, v, parts, 0)


def chunked_attention(q, k, v, parts: Parts, chunk_size: int = 256):
    T = q.shape[-2]
    halo = getattr(parts.processor, "halo", 0)
    sees_future = not parts.causal or getattr(parts.processor, "leak", False)
    recompute = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    outs, rems = [], []
    for q0 in range(0, T, chunk_size):
        q1 = min(T, q0 + chunk_size)
        Tk = T if sees_future else min(T, q1 + halo)
        args = (q[:, :, q0:q1], k[:, :, :Tk], v[:, :, :Tk], parts, q0)
        # Recompute each block in backward so training memory stays at one block, not T x T.
        out, rem = checkpoint(block_attention, *args, use_reentrant=False) if recompute else block_attention(*args)
        outs.append(out)
        rems.append(rem)
    rem = None if rems[0] is None else torch.cat(rems, -1)
    return torch.cat(outs, -2), rem


def sdpa_attention(q, k, v, parts: Parts):
    return F.scaled_dot_product_attention(q, k, v, is_causal=parts.causal), None


_compiled_flex = None


def flex_attention(q, k, v, parts: Parts):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention as flex

    global _compiled_flex
    if not q.is_cuda and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError("FlexAttention has no backward on CPU; train with backend='chunked' (or 'auto')")
    T = q.shape[-2]
    table = parts.bias.table(T, q.device)  # [H, 2T - 1]
    table = table.to(torch.float64 if q.dtype == torch.float64 else torch.float32)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + T - 1]

    block_mask = None
    if parts.causal:
        block_mask = create_block_mask(lambda b, h, qi, ki: ki <= qi, None, None, T, T, device=q.device)
    if not q.is_cuda:
        return flex(q, k, v, score_mod=score_mod, block_mask=block_mask), None
    if _compiled_flex is None:
        # One compiled kernel per sequence length: an evaluation sweeps ~8 lengths, more than
        # dynamo's default recompile limit, past which it would silently run flex unfused.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _compiled_flex = torch.compile(flex, dynamic=False)
    # Inductor's default tiles ask for more shared memory than an H200 has once the bias table needs
    # a gradient (245760 > 232448 bytes, measured); these smaller ones fit.
    options = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32}
    return _compiled_flex(q, k, v, score_mod=score_mod, block_mask=block_mask, kernel_options=options), None


def unsupported_reason(backend: str, parts: Parts, device: torch.device) -> str | None:
    """Why `backend` cannot compute this composition on `device`, or None if it can."""
    softmax = parts.normaliser.name == "softmax"
    if backend in ("dense", "chunked"):
        return None
    if backend == "sdpa":
        if parts.bias is not None or parts.processor is not None or not softmax:
            return "fused SDPA takes only plain softmax attention (no bias, no score processor)"
        return None
    if backend == "flex":
        if parts.bias is None or not getattr(parts.bias, "pointwise", False) or parts.processor is not None or not softmax:
            return "FlexAttention here takes softmax with a per-distance bias (alibi, kerple, kerple-power, t5) and no processor"
        if not _has_flex():
            return "this torch has no FlexAttention"
        if device.type == "cuda" and parts.head_dim is not None and parts.head_dim < 16:
            # the compiled kernel refuses smaller heads (the CHE encoder has d 64 / 8 heads = 8)
            return f"compiled FlexAttention needs a head dim of at least 16 (got {parts.head_dim})"
        return None
    if backend == "triton":
        from ..ops import triton_unsupported_reason

        return triton_unsupported_reason(parts, device)
    raise ValueError(f"unknown backend {backend!r}; choose one of auto, {', '.join(BACKENDS)}")


def _has_flex() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def plan_backend(parts: Parts, device: torch.device, requested: str = "auto") -> str:
    """The fastest backend for this composition, or the requested one (an error if it cannot run it).
    FlexAttention is only chosen automatically on CUDA: on CPU it runs unfused."""
    if requested != "auto":
        reason = unsupported_reason(requested, parts, device)
        if reason:
            ok = [b for b in BACKENDS if unsupported_reason(b, parts, device) is None]
            raise ValueError(f"backend {requested!r} cannot run this attention: {reason}. Usable here: {', '.join(ok)}")
        return requested
    for backend in AUTO_ORDER:
        if backend == "flex" and device.type != "cuda":
            continue
        if unsupported_reason(backend, parts, device) is None:
            return backend
    return "chunked"


def run_backend(backend: str, q, k, v, parts: Parts, chunk_size: int = 256):
    if backend == "dense":
        return dense_attention(q, k, v, parts)
    if backend == "chunked":
        return chunked_attention(q, k, v, parts, chunk_size)
    if backend == "sdpa":
        return sdpa_attention(q, k, v, parts)
    if backend == "flex":
        return flex_attention(q, k, v, parts)
    if backend == "triton":
        from ..ops import triton_attention

        return triton_attention(q, k, v, parts)
    raise ValueError(f"unknown backend {backend!r}; choose one of auto, {', '.join(BACKENDS)}")
