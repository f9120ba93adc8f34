"""A set of 16-byte digests in compact memory: exact-duplicate removal over a corpus larger than
memory keeps one digest per document, in 16-byte slots at most 70% full (23 to 46 bytes a
document, where a Python set of bytes takes about 100)."""

from __future__ import annotations

import numpy as np

MAX_LOAD = 0.7


class DigestSet:
    """Open addressing with linear probing over two uint64 columns (the first 8 bytes also pick the
    slot); an all-zero slot is empty, so the all-zero digest is kept aside. Slots never empty again."""

    def __init__(self, capacity: int = 1 << 10):
        if capacity < 2 or capacity & (capacity - 1):
            raise ValueError(f"capacity must be a power of two >= 2, got {capacity}")
        self._hi = np.zeros(capacity, dtype=np.uint64)
        self._lo = np.zeros(capacity, dtype=np.uint64)
        self._n = 0
        self._zero = False

    def __len__(self) -> int:
        return self._n + self._zero

    @property
    def nbytes(self) -> int:
        return self._hi.nbytes + self._lo.nbytes

    def add(self, digest: bytes) -> bool:
        """Add a 16-byte digest; whether it was new."""
        if len(digest) != 16:
            raise ValueError(f"a digest is 16 bytes, got {len(digest)}")
        hi = int.from_bytes(digest[:8], "little")
        lo = int.from_bytes(digest[8:], "little")
        if hi == lo == 0:
            new, self._zero = not self._zero, True
            return new
        mask = len(self._hi) - 1
        i = hi & mask
        while True:
            h, low = int(self._hi[i]), int(self._lo[i])
            if h == low == 0:
                break
            if h == hi and low == lo:
                return False
            i = (i + 1) & mask
        self._hi[i], self._lo[i] = hi, lo
        self._n += 1
        if self._n > MAX_LOAD * len(self._hi):
            self._grow()
        return True

    def _grow(self) -> None:
        full = np.flatnonzero((self._hi != 0) | (self._lo != 0))
        hi, lo = self._hi[full], self._lo[full]
        self._hi = np.zeros(2 * len(self._hi), dtype=np.uint64)
        self._lo = np.zeros_like(self._hi)
        mask = np.uint64(len(self._hi) - 1)
        slot = hi & mask
        pending = np.arange(len(hi))
        # Place every key at once, in rounds: a key takes its slot when the slot is empty and it is
        # the first key there this round; the others move one slot on. A key only ever passes full
        # slots, so lookups (which probe until an empty slot) find every key.
        while len(pending):
            at = slot[pending]
            free = (self._hi[at] == 0) & (self._lo[at] == 0)
            _, first = np.unique(at[free], return_index=True)
            placed = pending[free][first]
            self._hi[slot[placed]], self._lo[slot[placed]] = hi[placed], lo[placed]
            pending = np.setdiff1d(pending, placed, assume_unique=True)
            slot[pending] = (slot[pending] + np.uint64(1)) & mask
