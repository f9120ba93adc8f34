"""The DAPE V2 kernels' host tables, cached between calls that need no gradient.

The fused kernels read per-call host operands built from the conv weights and the bias table
(reference.dape_v2_tables, gluon.prepare: ~25 small ops, 0.7-1.0 ms a call at 8192, more than SDPA's
whole forward there). Evaluation and generation call them with the same weights over and over, so
`cached` keeps them in a lenx.ops.kept Store, one value per caller's key (T, the kernel) and source
tensors, valid while those tensors are unchanged (the Store says when; it empties itself after
every optimizer step). The table itself is built per call, so the caller
names the leaf tensors it comes from (the bias module's parameters and buffers), not the table.

Work that needs a gradient never uses the cache: the tables must then be built inside the autograd
graph. A tensor changed behind autograd's back (`p.data.copy_`) is not seen; `clear()` drops
every entry.
"""

import torch

from ..kept import Store

MAX_ENTRIES = 48        # 12 layers x 4 lengths
MAX_BYTES = 1 << 30     # t1, k0, t2 at T 65536, D 32: ~32 MB a layer


def _needs_grad(sources) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in sources)


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return 0


_store = Store(MAX_ENTRIES, MAX_BYTES, _nbytes)


def cached(sources, key, build):
    """build() (the host tables), or the value it gave for the same sources and key. sources: the
    leaf tensors build reads (conv weights, the bias's parameters and buffers); key: hashable,
    whatever else the value depends on (T, device, dtype, the kernel). Built afresh, and not kept,
    when any source needs a gradient."""
    sources = [t for t in sources if t is not None]
    if _needs_grad(sources):
        return build()
    full = (key, tuple(id(t) for t in sources))
    value = _store.get(full, sources)
    if value is None:
        value = build()
        _store.put(full, sources, value)
    return value


def clear():
    _store.clear()


def size() -> int:
    return len(_store)
