"""Near-duplicate removal (MinHash LSH over word 5-grams) on crafted documents: copies with a few words
changed, reordered or re-indented go, documents that share less stay, the first of a group is kept."""

from __future__ import annotations

import sys
import weakref

import numpy as np
import pytest

from lenx.data import DataError
from lenx.data.build import neardup
from lenx.data.build.neardup import THRESHOLD, NearDupIndex, NearDupScan, find_near_duplicates, shingle_hashes

WORDS = [f"w{i}" for i in range(5000)]


def words(seed: int, n: int = 600) -> list[str]:
    return list(np.random.default_rng(seed).choice(WORDS, n))


def edited(ws: list[str], share: float, seed: int) -> list[str]:
    """`ws` with `share` of its words replaced by words from elsewhere."""
    rng = np.random.default_rng(seed)
    out = list(ws)
    for i in rng.choice(len(ws), int(share * len(ws)), replace=False):
        out[i] = f"new{seed}_{i}"
    return out


def exact_jaccard(a: str, b: str) -> float:
    x, y = set(shingle_hashes(a).tolist()), set(shingle_hashes(b).tolist())
    return len(x & y) / len(x | y)


def test_shingles_ignore_punctuation_and_spacing_but_not_order_or_case():
    text = "static int foo(struct bar *b) { return b->x + 1; }"
    same = "static  int\tfoo ( struct bar* b )\n{\n\treturn b -> x+1 ;\n}\n"
    assert np.array_equal(shingle_hashes(text), shingle_hashes(same))
    assert not np.array_equal(shingle_hashes(text), shingle_hashes(text.upper()))
    swapped = "int static foo(struct bar *b) { return b->x + 1; }"
    # 10 words, 6 5-grams; swapping the first two words changes the two 5-grams that hold both
    assert len(shingle_hashes(text)) == 6 and shingle_hashes(text).dtype == np.uint64
    assert len(set(shingle_hashes(text).tolist()) & set(shingle_hashes(swapped).tolist())) == 4
    assert len(shingle_hashes("three short words")) == 1  # fewer than 5 words: one shingle
    assert len(shingle_hashes("  ;; {} ")) == 0 and len(shingle_hashes("")) == 0
    assert shingle_hashes("Grüße aus Köln, 東京 und Zürich").size == 2  # non-ASCII letters are word characters
    assert shingle_hashes("one two three four five six").max() < 2**32


def test_minhash_estimates_the_jaccard_of_the_shingle_sets():
    base = words(1)
    index = NearDupIndex()
    for share in (0.02, 0.1, 0.3):
        a, b = " ".join(base), " ".join(edited(base, share, 7))
        est = index.minhash(a).jaccard(index.minhash(b))
        assert abs(est - exact_jaccard(a, b)) < 0.12, (share, est, exact_jaccard(a, b))


def test_crafted_near_duplicates_go_and_the_first_of_each_group_stays():
    base = words(1)
    code = "\n".join(f"static int f{i}(int x)\n{{\n\treturn x * {i} + {i * 7};\n}}\n" for i in range(80))
    docs = [
        ("a", " ".join(base)),
        ("b", " ".join(words(2))),                                  # unrelated
        ("a-typos", " ".join(edited(base, 0.02, 3))),               # 2% of the words changed
        ("a-half", " ".join(edited(base, 0.5, 4))),                 # half changed: related, not a copy
        ("a-reflowed", "\n".join(" ".join(base[i : i + 9]) for i in range(0, len(base), 9))),
        ("a-blocks-swapped", " ".join(base[300:] + base[:300])),    # two halves in the other order
        ("code", code),
        ("code-reindented", code.replace("\t", "    ").replace("{\n", "{ ")),
        ("code-renamed", code.replace("return x", "return y").replace("int x", "int y")),
        ("b-typos", " ".join(edited(words(2), 0.01, 5))),
    ]
    assert exact_jaccard(docs[0][1], docs[2][1]) > 0.8 and exact_jaccard(docs[0][1], docs[3][1]) < 0.2
    drop, record = find_near_duplicates(docs)
    dropped = {docs[i][0] for i in drop}
    assert dropped == {"a-typos", "a-reflowed", "a-blocks-swapped", "code-reindented", "b-typos"}
    assert list(drop) == sorted(drop)
    # "code-renamed": every function's return line changed, which changes most 5-grams of a short function
    assert exact_jaccard(code, docs[8][1]) < THRESHOLD
    of = {d["doc"]: d["of"] for d in record["near_duplicate_docs"]}
    assert of == {"a-typos": "a", "a-reflowed": "a", "a-blocks-swapped": "a", "code-reindented": "code",
                  "b-typos": "b"}
    assert record["docs_checked"] == len(docs) and record["docs_dropped"] == 5
    assert record["chars_dropped"] == sum(len(t) for n, t in docs if n in dropped)
    assert record["rule"] == neardup.RULE and record["threshold"] == THRESHOLD and record["shingle_words"] == 5
    jaccards = [d["jaccard"] for d in record["near_duplicate_docs"]]
    assert jaccards == sorted(jaccards, reverse=True) and min(jaccards) >= THRESHOLD
    # deterministic: the same documents drop the same way
    again, record2 = find_near_duplicates(docs)
    assert np.array_equal(drop, again) and record2 == record


def test_order_decides_which_copy_stays():
    a, b = " ".join(words(1)), " ".join(edited(words(1), 0.02, 3))
    assert list(find_near_duplicates([("x", a), ("y", b)])[0]) == [1]
    assert list(find_near_duplicates([("y", b), ("x", a)])[0]) == [1]


def test_skipped_documents_are_neither_checked_nor_kept():
    text = " ".join(words(1))
    docs = [("non-text", text), ("copy", text), ("copy-2", text + " tail")]
    drop, record = find_near_duplicates(docs, skip=[0])
    assert list(drop) == [2] and record["docs_checked"] == 2
    assert record["near_duplicate_docs"][0]["of"] == "copy"


def test_the_listing_is_capped(monkeypatch):
    monkeypatch.setattr(neardup, "LISTED", 2)
    text = " ".join(words(1))
    docs = [(str(i), text + f" v{i}") for i in range(5)]
    drop, record = find_near_duplicates(docs)
    assert record["docs_dropped"] == 4 and len(drop) == 4 and len(record["near_duplicate_docs"]) == 2


def test_summary_line():
    _, record = find_near_duplicates([("a", "one two three four five six"), ("b", "one two three four five six!")])
    line = neardup.summary_line({"near_dup": record})
    assert line.startswith("near-duplicate documents: 1 of 2 dropped") and "0.7" in line
    assert neardup.summary_line({"name": "tech"}) is None


def test_missing_datasketch_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasketch", None)  # import fails as when it is not installed
    with pytest.raises(DataError, match=r"pip install 'lenx\[dedup\]'") as e:
        neardup.check_available()
    assert "\n" not in str(e.value)
    with pytest.raises(DataError, match="datasketch"):
        NearDupIndex()


def test_the_index_is_freed_when_the_scan_ends():
    """datasketch's LSH refers to itself, so without help it would outlive the scan until the cyclic
    collector runs, holding a few KB per document through the build's later passes."""
    scan = NearDupScan()
    lsh = weakref.ref(scan._index._lsh)
    text = " ".join(words(1))
    assert not scan.add(0, "a", text) and scan.add(1, "b", text + " end")
    drop, record = scan.result()
    assert list(drop) == [1] and record["near_duplicate_docs"][0]["of"] == "a"
    assert lsh() is None
