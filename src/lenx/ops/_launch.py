"""Host-side helpers shared by the kernel launchers: output allocation, strides, matmul precision
and input checks. Plain torch (no triton), so the op packages import without triton installed."""

import os

import torch

# Debug switch for the tests: outputs that would be torch.empty start as NaN instead, so an element
# a kernel forgets to write fails the comparison.
POISON = bool(os.environ.get("LENX_TRITON_POISON"))

LOG2E = 1.4426950408889634
HEAD_DIMS = (16, 32, 64, 128)


def new(shape, like, dtype=None):
    dtype = like.dtype if dtype is None else dtype
    if POISON:
        return torch.full(shape, float("nan"), dtype=dtype, device=like.device)
    return torch.empty(shape, dtype=dtype, device=like.device)


def new_like(x):
    """Same shape and strides as x (so a gradient can reuse x's strides in the kernel)."""
    return torch.full_like(x, float("nan")) if POISON else torch.empty_like(x)


def dot_precision(dtype) -> str:
    # fp32 inputs get exact fp32 products (the tests hold them to ~1e-5); bf16/fp16 use tensor cores.
    return "ieee" if dtype == torch.float32 else "tf32"


def strides(x):
    """Batch, head and time strides of a [B, H, T, d] tensor (d is contiguous)."""
    return x.stride(0), x.stride(1), x.stride(2)


def pow2(n: int, least: int = 16) -> int:
    """The smallest power of two >= n, and at least `least`."""
    return max(least, 1 << max(0, n - 1).bit_length())


def check_qkv(q, k, v):
    """One-line errors for inputs no fused kernel takes."""
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must all be [B, H, T, d], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"the fused kernels take head dims 16, 32, 64 or 128, got {q.shape[-1]}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one of fp16/bf16/fp32, got {q.dtype}, {k.dtype}, {v.dtype}")


def check_table(table, H: int, T: int):
    """A per-distance bias table must be [H, 2T - 1]."""
    if tuple(table.shape) != (H, 2 * T - 1):
        raise ValueError(f"bias table must be [H, 2T - 1] = [{H}, {2 * T - 1}], got {tuple(table.shape)}")


def check_dape_v2_weights(w1, w2, H: int, T: int, table):
    """DAPE V2's conv weights w1 [D, C, 1, k] (C = 2H with a bias table, H without) and w2 [H, D, 1, k]
    against H heads, and the table against [H, 2T - 1]."""
    D, C, _, ks = w1.shape
    if C != (2 * H if table is not None else H) or tuple(w2.shape) != (H, D, 1, ks):
        raise ValueError(f"conv weights {tuple(w1.shape)}, {tuple(w2.shape)} do not fit {H} heads "
                         f"{'with' if table is not None else 'without'} a bias table")
    if table is not None:
        check_table(table, H, T)


def check_masks(window, segments, B: int, T: int, device):
    """A window and document ids checked for the masked kernels -> (window, spans). window: an int >= 0
    (0: none; one of T or more masks nothing and becomes 0). spans: None, or int32 [2, B, T], the
    first and the last position of each token's document (two tokens share a document iff their
    first positions agree, so the kernels compare those; the ids themselves may be any integers in
    any order). The kernels skip the key tiles before the earliest first position of a row block,
    and the key-owner kernel the query tiles after the latest last position of its keys. Built with
    a stable sort, no host sync: ids need not be non-decreasing (they are in a packed window, whose
    documents are contiguous runs; elsewhere a document's runs all count as its span)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an int >= 0 (0: none), got {window!r}")
    if segments is None:
        return (0 if window >= T else window), None
    if tuple(segments.shape) != (B, T) or segments.dtype.is_floating_point or segments.dtype == torch.bool:
        raise ValueError(f"segments must be integer document ids [B, T] = [{B}, {T}], got {segments.dtype} "
                         f"{tuple(segments.shape)}")
    ids, order = segments.to(device=device, dtype=torch.int64).sort(dim=-1, stable=True)
    # equal ids are one run of the sorted row, their positions increasing (a stable sort)
    lo = torch.searchsorted(ids, ids, side="left")
    hi = torch.searchsorted(ids, ids, side="right") - 1
    spans = torch.empty(2, B, T, dtype=torch.int64, device=device)
    spans[0].scatter_(1, order, order.gather(1, lo))
    spans[1].scatter_(1, order, order.gather(1, hi))
    return (0 if window >= T else window), spans.to(torch.int32)
