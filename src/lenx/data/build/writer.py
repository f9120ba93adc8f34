"""Writing a split of a corpus: its token stream and document index (the files lenx.data.layout
describes), and its counts for the manifest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..layout import index_file, tokens_file

LONG = (8192, 16384)  # test documents at least this many tokens are counted in the manifest


def write_split(folder: Path, split: str, docs: Iterator[np.ndarray], eos_id: int,
                long: tuple[int, ...] = LONG) -> dict:
    """Write <split>.bin and <split>.idx.npy; return the split's stats."""
    index, pos = [], 0
    eos = np.array([eos_id], dtype=np.uint16)
    with open(tokens_file(folder, split), "wb") as f:
        for ids in docs:
            index.append((pos, len(ids)))
            f.write(ids.astype(np.uint16, copy=False).tobytes())
            f.write(eos.tobytes())
            pos += len(ids) + 1
    idx = np.array(index, dtype=np.int64).reshape(-1, 2)
    with open(index_file(folder, split), "wb") as f:
        np.save(f, idx)
    lens = idx[:, 1]
    stats = {"docs": len(idx), "tokens": pos, "doc_tokens": int(lens.sum()),
             "max_doc_tokens": int(lens.max()) if len(lens) else 0}
    for n in long:
        stats[f"docs_ge_{n}_tokens"] = int((lens >= n).sum())
    return stats
