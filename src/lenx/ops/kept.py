"""Values the fused kernels keep between calls (a bias's bands: biased_softmax/bands.py; DAPE V2's
host tables: dape_v2/tables.py), each valid while the tensors it was built from are unchanged.

An entry holds its sources' stamp, each one's identity, data_ptr and _version (an in-place update
or load_state_dict bumps _version; `p.data.copy_` does not and is not seen), and weak references to
them (a freed tensor's address and version can come back on a new one). torch's fused optimizers
(AdamW(fused=True), lenx's on CUDA) write the parameters without bumping _version, so every Store
is emptied after each optimizer step: a global step post-hook, registered on import, for any torch
optimizer in any training loop. Without it a Kerple layer trained on the fused kernels kept its
first step's bands for the whole run.

A Store keeps one value per key (a changed source replaces it), at most max_entries values and
max_bytes bytes (nbytes(value), counted when bounding: a value may grow), the least recently used
going first; an entry put with an owner goes when the owner is freed."""

import weakref
from collections import OrderedDict

from torch.optim.optimizer import register_optimizer_step_post_hook

_stores: weakref.WeakSet = weakref.WeakSet()


def stamp(sources) -> tuple | None:
    """Each source's (identity, data_ptr, _version, dtype, device, shape); None where one is an
    inference tensor, which has no version counter (nothing to key on)."""
    try:
        return tuple((id(t), t.data_ptr(), t._version, t.dtype, t.device, tuple(t.shape)) for t in sources)
    except RuntimeError:
        return None


class Store:
    def __init__(self, max_entries: int, max_bytes: int, nbytes):
        self.max_entries, self.max_bytes, self.nbytes = max_entries, max_bytes, nbytes
        self._entries: OrderedDict = OrderedDict()  # key -> (stamp, weak refs to the sources, owner's, value)
        _stores.add(self)

    def get(self, key, sources, owner=None):
        """The value kept under key from these very sources (and owner), unchanged since; else None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        kept_stamp, refs, owner_ref, value = entry
        now = stamp(sources)
        if now is None or now != kept_stamp or any(r() is not t for r, t in zip(refs, sources)) \
                or (owner is not None and (owner_ref is None or owner_ref() is not owner)):
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key, sources, value, owner=None) -> None:
        """Keeps value under key in place of what was there (not at all where a source is an
        inference tensor), then drops the least recently used entries over the bounds."""
        self._entries.pop(key, None)
        kept_stamp = stamp(sources)
        if kept_stamp is None:
            return
        # the entry goes with its owner (a model freed: its bands with it); a replaced entry's
        # reference dies with it, and its callback with it
        owner_ref = None if owner is None else weakref.ref(owner, lambda _, key=key: self._entries.pop(key, None))
        self._entries[key] = (kept_stamp, [weakref.ref(t) for t in sources], owner_ref, value)
        while len(self._entries) > self.max_entries or (
                len(self._entries) > 1 and sum(self.nbytes(e[3]) for e in self._entries.values()) > self.max_bytes):
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def forget_all(*_) -> None:
    """Empties every Store (an optimizer step post-hook's signature)."""
    for store in list(_stores):
        store.clear()


register_optimizer_step_post_hook(forget_all)
