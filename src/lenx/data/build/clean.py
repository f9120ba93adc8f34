"""Cleaning a corpus's documents: UTF-8 text with Unix newlines, no empty documents, no exact
duplicates."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


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


def clean_docs(docs: Iterable[tuple[str, str | bytes]]) -> tuple[list[tuple[str, str]], dict]:
    """Normalise, drop empty documents and exact duplicates (first one wins)."""
    out, seen = [], set()
    stats = {"docs_read": 0, "empty_dropped": 0, "duplicates_dropped": 0, "not_utf8_kept_with_replacements": 0}
    for doc_id, data in docs:
        stats["docs_read"] += 1
        text, valid = _decode(data)
        text = normalise(text)
        if not text.strip():
            stats["empty_dropped"] += 1
            continue
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        if digest in seen:
            stats["duplicates_dropped"] += 1
            continue
        seen.add(digest)
        stats["not_utf8_kept_with_replacements"] += not valid
        out.append((doc_id, text))
    stats["docs_kept"] = len(out)
    return out, stats
