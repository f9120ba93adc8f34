"""Writing a split of a corpus: its token stream and document index (the files lenx.data.layout
describes), and its counts for the manifest; the spool that holds a split's documents as they are
encoded, to be written in the split's own order."""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from ..layout import index_file, tokens_file

LONG = (8192, 16384)  # test documents at least this many tokens are counted in the manifest


def _int64(values: array) -> np.ndarray:
    return np.frombuffer(values, dtype=np.int64) if values else np.zeros(0, dtype=np.int64)


def write_split(folder: Path, split: str, docs: Iterable[np.ndarray], eos_id: int,
                long: tuple[int, ...] = LONG, dtype: str = "uint16") -> dict:
    """Write <split>.bin (tokens as `dtype`) and <split>.idx.npy; return the split's stats."""
    starts, lengths, pos = array("q"), array("q"), 0  # 16 bytes a document
    dtype = np.dtype(dtype)
    eos = np.array([eos_id], dtype=dtype).tobytes()
    with open(tokens_file(folder, split), "wb") as f:
        for ids in docs:
            starts.append(pos)
            lengths.append(len(ids))
            f.write(np.asarray(ids).astype(dtype, copy=False).tobytes())
            f.write(eos)
            pos += len(ids) + 1
    idx = np.stack([_int64(starts), _int64(lengths)], axis=1)
    with open(index_file(folder, split), "wb") as f:
        np.save(f, idx)
    lens = idx[:, 1]
    stats = {"docs": len(idx), "tokens": pos, "doc_tokens": int(lens.sum()),
             "max_doc_tokens": int(lens.max()) if len(lens) else 0}
    for n in long:
        stats[f"docs_ge_{n}_tokens"] = int((lens >= n).sum())
    return stats


class Spool:
    """A split's documents' token ids as they are encoded (in the order the input holds them), in a
    scratch file of the build folder, read back in any order by `replay`; the file is removed on close."""

    def __init__(self, folder: Path, split: str, dtype: str):
        self.path = Path(folder) / f".{split}.spool.tmp-{os.getpid()}"
        self.dtype = np.dtype(dtype)
        self._f = open(self.path, "w+b")
        self._starts, self._lengths, self._pos = array("q"), array("q"), 0

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, ids: np.ndarray) -> None:
        self._starts.append(self._pos)
        self._lengths.append(len(ids))
        self._f.write(np.asarray(ids).astype(self.dtype, copy=False).tobytes())
        self._pos += len(ids)

    def replay(self, order: Iterable[int]) -> Iterator[np.ndarray]:
        """The token ids of the documents numbered `order` (0 = the first one added)."""
        size = self.dtype.itemsize
        for k in order:
            self._f.seek(self._starts[k] * size)
            yield np.frombuffer(self._f.read(self._lengths[k] * size), dtype=self.dtype)

    def close(self) -> None:
        self._f.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
