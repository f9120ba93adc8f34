"""Dropping non-text documents: those a language model cannot read, such as a file padded with NUL
bytes or an image encoded in base64.

The rule ("non-text share"), computed from the text alone, before any tokenizer exists: a document
is non-text when at least MAX_SHARE of its characters lie in non-text spans, which are
  - control characters other than tab, newline, carriage return and form feed (C0, DEL, C1):
    NUL padding, binary data;
  - encoded runs: ENCODED_RUN or more characters of the base64 alphabet [A-Za-z0-9+/=] holding both
    a letter and a digit (base64 and hex, wrapped into lines or not);
  - unbroken runs: UNBROKEN_RUN or more printable ASCII characters without whitespace, of at least
    UNBROKEN_DISTINCT different characters (one-line data: minified JSON, data URIs; a ruler of "=",
    a fill of "0," or a repeated column spec is predictable, and text).
The thresholds come from the share's distribution over every document of the built-in corpora
(notes/data_filter.md): every ordinary document of `tech` and `books` has a share of at most 0.23
(9,647 of tech's 9,828 documents and 435 of books' 439 have 0, books' largest is below 0.0001), and
the two above it, 0.42 (a LaTeX file padded with 7,295 NULs) and 0.997 (an image in base64), are
documents no model reads.
U+FFFD (bytes that were not UTF-8) does not count: those documents are text in a legacy encoding
whose share of replacements runs from 0 to 0.71 without a gap (cleaning counts them).

The builder deals the splits over all documents and then takes the non-text ones out of theirs
(lenx.data.build.text), so every other document stays in the split it had without the filter: a
split, and the tokenizer trained on train, change only where a non-text document was.
"""

from __future__ import annotations

import heapq
import re
from array import array

import numpy as np

RULE = "non-text share"
MAX_SHARE = 0.3
ENCODED_RUN = 40
UNBROKEN_RUN = 256
UNBROKEN_DISTINCT = 16
LISTED = 100  # the manifest lists at most this many non-text documents (the highest shares)

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]+")
_ENCODED = re.compile(r"[A-Za-z0-9+/=]{%d,}" % ENCODED_RUN)
_UNBROKEN = re.compile(r"[!-~]{%d,}" % UNBROKEN_RUN)
_DIGIT, _LETTER = re.compile(r"[0-9]"), re.compile(r"[A-Za-z]")


def rule() -> dict:
    """The rule's name and thresholds, as the manifest and the corpus's params record them."""
    return {"rule": RULE, "max_share": MAX_SHARE, "encoded_run": ENCODED_RUN, "unbroken_run": UNBROKEN_RUN,
            "unbroken_distinct": UNBROKEN_DISTINCT}


def non_text_share(text: str) -> float:
    """The share of `text`'s characters that lie in non-text spans (see the module's docstring)."""
    if not text:
        return 0.0
    spans = [m.span() for m in _CONTROL.finditer(text)]
    spans += [m.span() for m in _UNBROKEN.finditer(text) if len(set(m.group())) >= UNBROKEN_DISTINCT]
    # Words of letters only (a long German compound) or digits only (a long number) are not encodings.
    spans += [m.span() for m in _ENCODED.finditer(text) if _DIGIT.search(m.group()) and _LETTER.search(m.group())]
    covered, end = 0, 0
    for a, b in sorted(spans):  # the union of the spans: an encoded run may lie inside an unbroken one
        a = max(a, end)
        if b > a:
            covered += b - a
            end = b
    return covered / len(text)


def is_non_text(text: str) -> bool:
    return non_text_share(text) >= MAX_SHARE


class NonTextScan:
    """Finds the non-text documents one document at a time, in order, keeping their indices and the
    LISTED highest shares (a corpus need not fit in memory)."""

    def __init__(self):
        self.checked, self.chars = 0, 0
        self.found = array("q")
        self._top: list[tuple[float, int, str, int]] = []  # a heap of (share, -index, doc id, chars)

    def add(self, doc_id: str, text: str) -> bool:
        """Check the next document; whether it is non-text."""
        i, self.checked = self.checked, self.checked + 1
        share = non_text_share(text)
        if share < MAX_SHARE:
            return False
        self.found.append(i)
        self.chars += len(text)
        item = (share, -i, doc_id, len(text))  # on equal shares the earlier document stays listed
        (heapq.heappush if len(self._top) < LISTED else heapq.heappushpop)(self._top, item)
        return True

    def result(self, keep: bool = False) -> tuple[np.ndarray, dict]:
        """The indices (sorted) of the non-text documents, to be dropped (none when `keep`), and the
        manifest's record: the rule, whether it was applied, the counts and the non-text documents
        with their shares, highest first."""
        found = np.frombuffer(self.found, dtype=np.int64).copy() if self.found else np.zeros(0, dtype=np.int64)
        record = rule() | {"applied": not keep, "docs_checked": self.checked, "docs_non_text": len(found),
                           "docs_dropped": 0 if keep else len(found), "chars_dropped": 0 if keep else self.chars}
        listed = sorted(self._top, key=lambda x: (-x[0], -x[1]))
        record["non_text_docs"] = [{"doc": doc, "share": round(float(share), 4), "chars": chars}
                                   for share, _, doc, chars in listed]
        return (np.zeros(0, dtype=np.int64) if keep else found), record


def find_non_text(docs: list[tuple[str, str]], keep: bool = False) -> tuple[np.ndarray, dict]:
    """The indices (sorted) of the non-text documents among the (doc_id, text) `docs`, and the
    manifest's record (NonTextScan.result)."""
    scan = NonTextScan()
    for doc_id, text in docs:
        scan.add(doc_id, text)
    return scan.result(keep)


def summary_line(manifest: dict) -> str | None:
    """One line for `lenx prepare`'s summary: what the filter dropped (or kept), by which rule."""
    r = manifest.get("non_text")
    if not isinstance(r, dict):
        return None
    how = (f"{r['rule']} >= {r['max_share']} (control characters, encoded runs of >= {r['encoded_run']}, "
           f"unbroken runs of >= {r['unbroken_run']} of >= {r['unbroken_distinct']} different characters)")
    n, checked = r["docs_non_text"], r["docs_checked"]
    if not r["applied"]:
        return f"non-text documents: {n:,} of {checked:,} kept (--keep-non-text; rule: {how})"
    return f"non-text documents: {n:,} of {checked:,} dropped, {r['chars_dropped']:,} characters ({how})"
