"""A split stored as shards (lenx.data.layout), read as one token stream: `ShardedTokens`.

The view has a length, a dtype and integer slicing [a:b] across shard boundaries; it memory-maps a
shard only when a slice first reaches into it, so a machine that holds some of the shards reads
the parts of the stream they hold. Reading into an absent (or wrongly sized) shard is a one-line
DataError naming the file and how to get it.
"""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np

from .errors import DataError
from .layout import shards_dir


class ShardedTokens:
    """The token stream of a sharded split: len(), .dtype, .shape, [i] and [a:b] (step 1), read-only."""

    def __init__(self, name: str, folder: Path, split: str, dtype: np.dtype, shards: list[dict]):
        self.name, self.folder, self.split, self.dtype = name, Path(folder), split, np.dtype(dtype)
        self.shards = shards
        self.starts = [s["start"] for s in shards]
        self._len = self.starts[-1] + shards[-1]["tokens"] if shards else 0
        self._maps: dict[int, np.memmap] = {}

    def __repr__(self) -> str:
        return f"ShardedTokens({self.name!r}, {self.split!r}, {len(self.shards)} shards, {self._len} tokens)"

    def __len__(self) -> int:
        return self._len

    @property
    def shape(self) -> tuple[int]:
        return (self._len,)

    @property
    def ndim(self) -> int:
        return 1

    def path(self, i: int) -> Path:
        return shards_dir(self.folder, self.split) / self.shards[i]["file"]

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(self._len)
            if step != 1:
                raise TypeError("a sharded token stream is sliced with step 1 only")
            return self._read(start, max(start, stop))
        if isinstance(key, (int, np.integer)):
            i = int(key) + self._len if key < 0 else int(key)
            if not 0 <= i < self._len:
                raise IndexError(f"token {int(key)} is outside the {self.split} split's {self._len} tokens")
            return self._read(i, i + 1)[0]
        raise TypeError(f"a sharded token stream is indexed by an integer or a slice, not {type(key).__name__}")

    def _read(self, a: int, b: int) -> np.ndarray:
        parts = []
        for i in self.covering(a, b):
            lo = self.starts[i]
            parts.append(self._map(i)[max(a, lo) - lo:min(b, lo + self.shards[i]["tokens"]) - lo])
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)

    def covering(self, a: int, b: int) -> range:
        """The indices of the shards that hold tokens [a, b)."""
        if b <= a:
            return range(0)
        return range(bisect.bisect_right(self.starts, a) - 1, bisect.bisect_left(self.starts, b))

    def problem(self, i: int) -> str | None:
        """Why shard i cannot be read ("is missing", "has N bytes, the manifest says M"), or None."""
        path = self.path(i)
        if not path.is_file():
            return "is missing"
        want = self.shards[i]["tokens"] * self.dtype.itemsize
        have = path.stat().st_size
        return None if have == want else f"has {have} bytes, the manifest says {want} (a partial copy?)"

    def unreadable(self, a: int = 0, b: int | None = None) -> list[int]:
        """The shards among those holding tokens [a, b) (default: all) that are absent or of the wrong size."""
        return [i for i in self.covering(a, self._len if b is None else b) if self.problem(i) is not None]

    def _map(self, i: int) -> np.memmap:
        if i not in self._maps:
            problem = self.problem(i)
            if problem is not None:
                raise DataError(f"{self.split} shard {self.path(i)} of corpus {self.name!r} {problem}; copy it from "
                                f"the machine where `lenx shard {self.name}` wrote it (it holds tokens "
                                f"{self.starts[i]:,}-{self.starts[i] + self.shards[i]['tokens']:,} of the split)")
            self._maps[i] = np.memmap(self.path(i), dtype=self.dtype, mode="r")
        return self._maps[i]
