"""A corpus's documents as the build reads them, pass after pass, without holding them: the first
pass (`scan`) cleans every record (lenx.data.build.clean), finds the non-text documents (and, when
asked, the near-duplicate ones: lenx.data.build.neardup) and keeps only what each later pass needs,
a few bytes per document: whether cleaning kept each record, each document's length and the dropped
ones. The near-duplicate index holds a few KB per document while the scan runs. Every later pass
reads the records again from their source (`Documents.texts`); for the built-in corpora that is the
list of fetched documents, or a source's files read again (the kernel tree of `code`)."""

from __future__ import annotations

from array import array
import re
from collections.abc import Callable, Iterable, Iterator

import numpy as np
from tqdm.auto import tqdm

from ..errors import DataError
from .clean import Cleaner, normalise
from .neardup import NearDupScan
from .nontext import NonTextScan

Records = Callable[[], Iterable[tuple[str, "str | bytes"]]]  # the (doc_id, text or bytes) records, from the start
# The tokenizers encode a long document in pieces cut at spaces and line breaks; a stretch without
# either is one pre-token, whose BPE grows with its length (a 3.9M-character one took over an hour),
# so a kept document holding a longer one is refused while it is read.
MAX_UNBROKEN = 1_000_000


class Documents:
    """The cleaned documents of a corpus, numbered 0.. in the order their source holds them."""

    def __init__(self, what: str, records: Records, kept: bytearray, lengths: np.ndarray, drop: np.ndarray,
                 cleaning: dict, non_text: dict, long_bytes: int, near_dup: dict | None = None):
        self.what = what  # the source, in words, for the error when it changes between passes
        self._records, self._kept = records, kept
        self.lengths = lengths  # int64: the characters of each document
        self.drop = drop  # the non-text (unless kept) and near-duplicate documents, sorted
        self.cleaning, self.non_text = cleaning, non_text
        self.near_dup = near_dup  # the near-duplicate filter's record, None when it did not run
        self.long_bytes = long_bytes  # text documents of at least `min_bytes` UTF-8 bytes (see scan)
        self.longest = ("", 0)  # the longest document's id and characters

    def __len__(self) -> int:
        return len(self.lengths)

    def texts(self, select: np.ndarray | None = None) -> Iterator[str]:
        """The texts of the documents `select` (their numbers, in any order; all by default), in
        document order, read again from the source."""
        want = None
        if select is not None:
            want = np.zeros(len(self), dtype=bool)
            want[np.asarray(select, dtype=np.int64)] = True
            if not want.any():
                return
        j, last = 0, len(self) - 1 if want is None else int(np.flatnonzero(want)[-1])
        records = iter(self._records())
        for keep in self._kept:
            record = next(records, None)
            if record is None:
                raise self._changed("has fewer records")
            if not keep:
                continue
            if want is None or want[j]:
                text = normalise(record[1])
                if len(text) != self.lengths[j]:
                    raise self._changed(f"record {record[0]} has another text")
                yield text
            if j == last:
                return  # the rest is not wanted
            j += 1

    def _changed(self, how: str) -> DataError:
        return DataError(f"{self.what} changed while lenx was building from it ({how} than when it was first "
                         "read); leave it as it is while `lenx prepare` runs, and run it again")


def scan(what: str, records: Records, keep_non_text: bool, min_bytes: int = 0, progress: bool = False,
         near_dup: bool = False) -> Documents:
    """Read every record once: clean it, check it for non-text and, with `near_dup`, check the text
    documents against the ones kept before them for near-duplicates; count the documents left of at
    least `min_bytes` UTF-8 bytes (when > 0). Holds one digest and a few numbers per document (and
    the near-duplicate index while it runs)."""
    cleaner, non_text = Cleaner(), NonTextScan()
    near = NearDupScan() if near_dup else None
    kept, lengths, long_bytes, longest = bytearray(), array("q"), 0, ("", 0)
    with tqdm(desc="reading", unit="doc", unit_scale=True, disable=not progress) as bar:
        for doc_id, data in records():
            text = cleaner.clean(data)
            kept.append(text is not None)
            bar.update(1)
            if text is None:
                continue
            lengths.append(len(text))
            if len(text) > longest[1]:
                longest = (doc_id, len(text))
            dropped = non_text.add(doc_id, text) and not keep_non_text
            # Non-text documents are neither checked nor kept for near-duplicates (they go anyway).
            if not dropped and near is not None:
                dropped = near.add(len(lengths) - 1, doc_id, text)
            if not dropped and len(text) > MAX_UNBROKEN:
                _check_unbroken(what, doc_id, text)
            if not dropped:
                long_bytes += bool(min_bytes) and len(text.encode("utf-8", "surrogatepass")) >= min_bytes
    drop, record = non_text.result(keep_non_text)
    near_drop, near_record = near.result() if near is not None else (drop[:0], None)
    lengths = np.frombuffer(lengths, dtype=np.int64).copy() if lengths else np.zeros(0, dtype=np.int64)
    docs = Documents(what, records, kept, lengths, np.union1d(drop, near_drop).astype(np.int64), cleaner.stats,
                     record, long_bytes, near_record)
    docs.longest = longest
    return docs


def _check_unbroken(what: str, doc_id: str, text: str) -> None:
    """A one-line DataError for a text holding more than MAX_UNBROKEN characters with no space or
    line break among them (one linear pass)."""
    for run in _UNBROKEN.finditer(text):
        if run.end() - run.start() > MAX_UNBROKEN:
            raise DataError(f"document {doc_id} of {what} holds {run.end() - run.start():,} characters without a "
                            f"space or line break (from character {run.start():,}); lenx tokenizes at most "
                            f"{MAX_UNBROKEN:,} such characters in one piece: split or remove that document")


_UNBROKEN = re.compile(r"[^ \n]+")
