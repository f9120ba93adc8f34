"""Near-duplicate documents, found with MinHash LSH (the `datasketch` library, extra `dedup`).

The rule ("word 5-gram MinHash LSH"): two documents are near-duplicates when the Jaccard similarity
of their sets of word 5-grams, estimated from NUM_PERM MinHash permutations, is at least THRESHOLD.
Words are runs of ASCII letters, digits, "_" and non-ASCII bytes (in UTF-8), so punctuation and
whitespace never matter, case does; a document of fewer than SHINGLE words has one shingle, its words.
Documents are visited in order and each is checked against the ones kept so far: the LSH index
(datasketch's bands for THRESHOLD) proposes candidates and their MinHash estimate confirms them.
A document with a confirmed near-duplicate among the kept ones is dropped, so the first document
of a group stays, as exact deduplication keeps the first copy (lenx.data.build.clean).

Why these numbers: 5-grams of words and a threshold of 0.7 are what code-corpus deduplication
commonly uses (two versions of one driver, a file copied into tools/ and edited, a device tree of
a sibling board); notes/code_corpus.md has what it removed from the `code` corpus.
"""

from __future__ import annotations

import gc
import heapq
import re
import zlib
from array import array

import numpy as np

from ..errors import DataError

RULE = "word 5-gram MinHash LSH"
SHINGLE = 5
NUM_PERM = 128
THRESHOLD = 0.7
SEED = 1  # datasketch's permutation seed: fixed, so a rebuild drops the same documents
LISTED = 100  # the manifest lists at most this many dropped documents (the most similar first)
_CHUNK = 1 << 14  # shingles per MinHash update: bounds update_batch's [n, NUM_PERM] temporary

_WORD = re.compile(rb"(?:\w|[\x80-\xff])+")  # on bytes, \w is ASCII only; other letters are their bytes
# Odd multipliers, one per position in a shingle, so "a b c d e" and "e d c b a" hash apart.
_MIX = np.array([0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1], dtype=np.uint64)


def rule() -> dict:
    """The rule's name and parameters, as the manifest and the corpus's params record them."""
    return {"rule": RULE, "shingle_words": SHINGLE, "num_perm": NUM_PERM, "threshold": THRESHOLD, "seed": SEED}


def check_available() -> None:
    """A one-line DataError when datasketch is missing (before any download or reading)."""
    try:
        import datasketch  # noqa: F401
    except ImportError as e:
        raise DataError("removing near-duplicate documents needs the `datasketch` package; run "
                        "`pip install 'lenx[dedup]'`") from e


def shingle_hashes(text: str) -> np.ndarray:
    """The distinct 32-bit hashes of `text`'s word 5-grams (uint64 holding 32-bit values)."""
    words = _WORD.findall(text.encode("utf-8", "surrogatepass"))
    if not words:
        return np.zeros(0, dtype=np.uint64)
    h = np.fromiter((zlib.crc32(w) for w in words), dtype=np.uint64, count=len(words))
    n = max(len(h) - SHINGLE + 1, 1)
    mixed = np.zeros(n, dtype=np.uint64)
    for k in range(min(SHINGLE, len(h))):
        mixed += h[k : k + n] * _MIX[k]  # wraps mod 2^64; the low 32 bits are the hash
    return np.unique(mixed & np.uint64(0xFFFFFFFF))


def _identity(x):
    return int(x)


class NearDupIndex:
    """The kept documents' MinHashes in an LSH index; `check` tells whether a new document is a
    near-duplicate of one of them (and keeps it when not). Documents are fed one at a time, so a
    streaming builder can use it as well as a list."""

    def __init__(self, threshold: float = THRESHOLD, num_perm: int = NUM_PERM):
        check_available()
        from datasketch import MinHash, MinHashLSH

        self.threshold, self.num_perm = threshold, num_perm
        self._lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
        self._template = MinHash(num_perm=num_perm, seed=SEED, hashfunc=_identity)
        self._kept: dict[int, object] = {}  # key -> LeanMinHash of a kept document

    def minhash(self, text: str):
        from datasketch import LeanMinHash, MinHash

        t = self._template
        m = MinHash(num_perm=self.num_perm, seed=SEED, hashfunc=_identity, permutations=t.permutations,
                    scheme=t.scheme)
        hashes = shingle_hashes(text)
        for i in range(0, len(hashes), _CHUNK):
            m.update_batch(hashes[i : i + _CHUNK])
        return LeanMinHash(m)

    def check(self, key: int, text: str) -> tuple[int, float] | None:
        """(key of the kept document it duplicates, estimated Jaccard), the most similar one; or None,
        and then the document is kept under `key`."""
        m = self.minhash(text)
        best = None
        for other in self._lsh.query(m):
            j = m.jaccard(self._kept[other])
            if j >= self.threshold and (best is None or j > best[1] or (j == best[1] and other < best[0])):
                best = (other, j)
        if best is None:
            self._lsh.insert(key, m)
            self._kept[key] = m
        return best


class NearDupScan:
    """Finds the near-duplicate documents one document at a time, in order, as the streaming scan
    (lenx.data.build.scan) reads them: it holds the kept documents' MinHashes in the LSH index (about
    6 KB a document with datasketch's 14 bands, 1 KB of it the signature) and their ids, the
    indices of the dropped ones and the LISTED most similar of those, never a text."""

    def __init__(self, threshold: float = THRESHOLD):
        self._index = NearDupIndex(threshold)
        self.checked, self.chars = 0, 0
        self.found = array("q")
        self._names: dict[int, str] = {}  # index -> doc id of each kept document (named as "of")
        self._top: list[tuple[float, int, str, int, int]] = []  # a heap of (jaccard, -index, doc id, chars, of)

    def add(self, i: int, doc_id: str, text: str) -> bool:
        """Check document number `i` (numbers increase from call to call); whether it is a
        near-duplicate of a document kept before it (else it is kept)."""
        self.checked += 1
        hit = self._index.check(i, text)
        if hit is None:
            self._names[i] = doc_id
            return False
        self.found.append(i)
        self.chars += len(text)
        item = (hit[1], -i, doc_id, len(text), hit[0])  # on equal similarity the earlier document stays listed
        (heapq.heappush if len(self._top) < LISTED else heapq.heappushpop)(self._top, item)
        return True

    def result(self) -> tuple[np.ndarray, dict]:
        """The indices (sorted) of the near-duplicates, and the manifest's record: the rule, the counts
        and the dropped documents (at most LISTED, most similar first) with the document each
        duplicates. This ends the scan: the index is freed."""
        # Free the index now: datasketch's LSH refers to itself (its bound method _H), so dropping it
        # leaves a few KB per document to the cyclic collector, which the next passes (the BPE trainer
        # runs outside Python) may not wake for a long while.
        self._index = None
        gc.collect()
        found = np.frombuffer(self.found, dtype=np.int64).copy() if self.found else np.zeros(0, dtype=np.int64)
        record = rule() | {"docs_checked": self.checked, "docs_dropped": len(found), "chars_dropped": self.chars}
        listed = sorted(self._top, key=lambda x: (-x[0], -x[1]))
        record["near_duplicate_docs"] = [{"doc": doc, "of": self._names[of], "jaccard": round(float(j), 4),
                                          "chars": chars} for j, _, doc, chars, of in listed]
        return found, record


def find_near_duplicates(docs: list[tuple[str, str]], skip=(), threshold: float = THRESHOLD) -> tuple[np.ndarray, dict]:
    """The indices (sorted) of the (doc_id, text) `docs` that are near-duplicates of an earlier kept
    document, and the manifest's record (NearDupScan.result). The documents `skip` (indices: the
    non-text ones, dropped anyway) are neither checked nor kept."""
    scan, skip = NearDupScan(threshold), set(int(i) for i in skip)
    for i, (doc_id, text) in enumerate(docs):
        if i not in skip:
            scan.add(i, doc_id, text)
    return scan.result()


def summary_line(manifest: dict) -> str | None:
    """One line for `lenx prepare`'s summary: what near-deduplication dropped, by which rule."""
    r = manifest.get("near_dup")
    if not isinstance(r, dict):
        return None
    return (f"near-duplicate documents: {r['docs_dropped']:,} of {r['docs_checked']:,} dropped, "
            f"{r['chars_dropped']:,} characters (Jaccard of word {r['shingle_words']}-grams >= {r['threshold']}, "
            f"MinHash LSH with {r['num_perm']} permutations)")
