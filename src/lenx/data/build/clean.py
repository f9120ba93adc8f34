"""Cleaning a corpus's documents: UTF-8 text with Unix newlines, no empty documents, no exact
duplicates."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from .digests import DigestSet


def _decode(data: str | bytes) -> tuple[str, bool]:
    """(text, whether it was valid UTF-8); invalid bytes become U+FFFD."""
    if isinstance(data, str):
        return data, True
    try:
        return data.decode("utf-8"), True
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace"), False


def normalise(data: str | bytes) -> str:
    """UTF-8 text with Unix newlines and no byte-order mark."""
    text = _decode(data)[0]
    return text.replace("\r\n", "\n").replace("\r", "\n").removeprefix("\ufeff")


class Cleaner:
    """Cleans documents one at a time, in order: normalise, drop empty documents and exact duplicates
    (the first one wins), keeping one 16-byte digest per document (lenx.data.build.digests)."""

    def __init__(self):
        self.seen = DigestSet()
        self.stats = {"docs_read": 0, "empty_dropped": 0, "duplicates_dropped": 0,
                      "not_utf8_kept_with_replacements": 0, "docs_kept": 0}

    def clean(self, data: str | bytes) -> str | None:
        """The document's cleaned text, or None when it is empty or a duplicate."""
        self.stats["docs_read"] += 1
        text, valid = _decode(data)
        text = normalise(text)
        if not text.strip():
            self.stats["empty_dropped"] += 1
            return None
        if not self.seen.add(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()):
            self.stats["duplicates_dropped"] += 1
            return None
        self.stats["not_utf8_kept_with_replacements"] += not valid
        self.stats["docs_kept"] += 1
        return text


def clean_docs(docs: Iterable[tuple[str, str | bytes]]) -> tuple[list[tuple[str, str]], dict]:
    """Normalise, drop empty documents and exact duplicates (first one wins)."""
    cleaner, out = Cleaner(), []
    for doc_id, data in docs:
        text = cleaner.clean(data)
        if text is not None:
            out.append((doc_id, text))
    return out, cleaner.stats
