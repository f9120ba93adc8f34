"""The DAPE V2 kernels' host tables, cached between calls that need no gradient.

The fused kernels read per-call host operands built from the conv weights and the bias table
(reference.dape_v2_tables, gluon.prepare: ~25 small ops, 0.7-1.0 ms a call at 8192, more than SDPA's
whole forward there). Evaluation and generation call them with the same weights over and over, so
`cached` keeps them, keyed on the tensors they derive from: each one's identity, data_ptr and
_version (an in-place update or load_state_dict bumps _version; a fused optimizer step does not, so
lenx.attention.backends.kept empties this cache after every optimizer step), dtype, device
and shape, plus the caller's key (T, the kernel). The table itself is built per call, so the caller
names the leaf tensors it comes from (the bias module's parameters and buffers), not the table.

Work that needs a gradient never uses the cache: the tables must then be built inside the autograd
graph. A tensor changed behind autograd's back (`p.data.copy_`, which does not bump _version)
is not seen; `clear()` drops every entry.
"""

import weakref
from collections import OrderedDict

import torch

MAX_ENTRIES = 48        # 12 layers x 4 lengths
MAX_BYTES = 1 << 30     # t1, k0, t2 at T 65536, D 32: ~32 MB a layer

_entries: OrderedDict = OrderedDict()  # key -> (weak references to the sources, value, bytes)


def _needs_grad(sources) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in sources)


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return 0


def cached(sources, key, build):
    """build() (the host tables), or the value it gave for the same sources and key. sources: the
    leaf tensors build reads (conv weights, the bias's parameters and buffers); key: hashable,
    whatever else the value depends on (T, device, dtype, the kernel). Built afresh, and not kept,
    when any source needs a gradient."""
    sources = [t for t in sources if t is not None]
    if _needs_grad(sources):
        return build()
    try:
        full = (key,) + tuple((id(t), t.data_ptr(), t._version, t.dtype, t.device, tuple(t.shape)) for t in sources)
    except RuntimeError:  # inference tensors have no version counter: nothing to key on
        return build()
    hit = _entries.get(full)
    # the same objects: a freed tensor's address and version can come back on a new one
    if hit is not None and all(ref() is t for ref, t in zip(hit[0], sources)):
        _entries.move_to_end(full)
        return hit[1]
    value = build()
    _entries[full] = ([weakref.ref(t) for t in sources], value, _nbytes(value))
    while len(_entries) > MAX_ENTRIES or (len(_entries) > 1 and sum(e[2] for e in _entries.values()) > MAX_BYTES):
        _entries.popitem(last=False)
    return value


def clear():
    _entries.clear()


def size() -> int:
    return len(_entries)
