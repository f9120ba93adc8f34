"""The `code` corpus end to end, offline (stand-in sources): near-duplicates dropped in the streaming
scan, long documents reserved for test by default, the kernel tree read again from its .deb on every
pass (never held), one-line errors before any download."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from corpus_helpers import make_deb, snapshot, split_texts, tar_bytes
from lenx.data import DataError, open_corpus
from lenx.data.build import prepare_corpus
from lenx.data.build import sources as sources_mod
from lenx.data.build.fetch import Fetched
from lenx.data.build.neardup import find_near_duplicates, rule
from lenx.data.build.scan import scan
from lenx.data.build.sources import Source
from lenx.data.build.splits import long_test_default

KW = dict(vocab_size=400, progress=False, long_test=4, long_test_tokens=600)


def code_like(seed: int, n_funcs: int) -> str:
    rng = np.random.default_rng(seed)
    names = [f"{a}_{b}" for a in ("dev", "buf", "reg", "irq", "ctx") for b in ("init", "read", "put", "lock")]
    return "".join(f"static int {rng.choice(names)}{seed}_{i}(struct {rng.choice(names)} *p)\n{{\n"
                   f"\treturn p->{rng.choice(names)} + {int(rng.integers(1000))};\n}}\n\n" for i in range(n_funcs))


def fake_code(monkeypatch, reader: bool = False, reads: list | None = None) -> dict[str, list[str]]:
    """Stand-in `code` sources: a tree of 40 files (10 long, 30 short) where 5 files are near-copies of
    others, and a text source. Returns the texts by kind ("kept", "near"). With `reader`, the tree
    source returns a function that yields its documents anew on every call (appending to `reads`),
    as the real kernel tree's does."""
    tree = [code_like(i, 60 if i < 10 else 3) for i in range(40)]
    near = [tree[0].replace("+ ", "+  ").replace("return", "return", 1) + "/* v2 */\n",  # a long one
            tree[1] + "static int extra(void)\n{\n\treturn 0;\n}\n",
            tree[12].replace("\t", "    "), tree[13] + "\n/* SPDX */\n", tree[14].replace("{\n", "{ ")]
    prose = [f"Paragraph {i}: the kernel schedules tasks; chapter {i} explains why. " * 8 for i in range(10)]

    def tree_get(reg):
        docs = [(f"linux-tree:{i}.c", t) for i, t in enumerate(tree + near)]
        if not reader:
            return [], docs

        def read():
            reads.append(1)
            yield from docs
        return [], read

    def prose_get(reg):
        return [], [(f"doc:{i}", t) for i, t in enumerate(prose)]

    monkeypatch.setitem(sources_mod.BUILTIN_SOURCES, "code",
                        lambda: [Source("linux-tree", tree_get), Source("texts", prose_get)])
    return {"kept": tree + prose, "near": near}


def test_code_corpus_drops_near_duplicates_and_reserves_long_test_documents(tmp_path, monkeypatch):
    texts = fake_code(monkeypatch)
    m = prepare_corpus("code", tmp_path, **KW)
    assert m["params"]["near_dup"] == rule() and m["params"]["long_test"] == 4
    nd = m["near_dup"]
    assert nd["docs_dropped"] == 5 and nd["docs_checked"] == 55
    assert {d["doc"] for d in nd["near_duplicate_docs"]} == {f"linux-tree:{i}.c" for i in range(40, 45)}
    assert {d["of"] for d in nd["near_duplicate_docs"]} == {f"linux-tree:{i}.c" for i in (0, 1, 12, 13, 14)}
    c = open_corpus("code", tmp_path)
    got = {s: split_texts(c, s) for s in ("train", "val", "test")}
    everything = sum(got.values(), [])
    assert sorted(everything) == sorted(texts["kept"])  # every other document, each in one split
    assert not set(texts["near"]) & set(everything)
    assert m["long_test"]["reserved_docs"] == 4 and m["splits"]["test"]["docs_ge_600_tokens"] >= 4
    assert m["splits"]["test"]["docs"] < len(everything) // 2  # the rest is split as usual
    # settings unchanged: already prepared
    assert prepare_corpus("code", tmp_path, **KW) == m


def test_code_corpus_defaults_to_300_long_test_documents(tmp_path, monkeypatch):
    assert long_test_default("code") == (300, 16385) and long_test_default("tech") == (0, 16384)
    fake_code(monkeypatch)
    with pytest.raises(DataError, match=r"needs at least 302 .* the 300 reserved for test by --long-test") as e:
        prepare_corpus("code", tmp_path, vocab_size=400, progress=False)
    assert "\n" not in str(e.value) and not (tmp_path / "code").exists()
    many = [Source("linux-tree", lambda reg: ([], [(str(i), code_like(i, 2)) for i in range(400)]))]
    monkeypatch.setitem(sources_mod.BUILTIN_SOURCES, "code", lambda: many)
    with pytest.raises(DataError, match=r"--long-test 300 needs 300 documents of >= 16385 tokens, .* has at most 0"):
        prepare_corpus("code", tmp_path, vocab_size=400, progress=False)


def test_missing_datasketch_fails_before_any_download(tmp_path, monkeypatch):
    def no_sources():
        raise AssertionError("the sources were read")

    monkeypatch.setitem(sources_mod.BUILTIN_SOURCES, "code", no_sources)
    monkeypatch.setitem(sys.modules, "datasketch", None)
    with pytest.raises(DataError, match=r"needs the `datasketch` package; run `pip install 'lenx\[dedup\]'`"):
        prepare_corpus("code", tmp_path, **KW)
    assert list(tmp_path.iterdir()) == []


def test_a_source_read_again_on_every_pass_builds_the_same_corpus(tmp_path, monkeypatch):
    """The kernel tree's source is a reader, not a list: the build reads it once to count it, once to
    scan it and again for every later pass, and the corpus is the one its list would build."""
    fake_code(monkeypatch)
    m = prepare_corpus("code", tmp_path / "list", **KW)
    reads = []
    fake_code(monkeypatch, reader=True, reads=reads)
    m2 = prepare_corpus("code", tmp_path / "reader", **KW)
    # counting, scanning, the BPE and token counts for the reservation, the final BPE, encoding
    assert len(reads) == 6
    assert m2["fingerprint"] == m["fingerprint"] and m2["near_dup"] == m["near_dup"]
    assert m2["sources"][0]["docs"] == m["sources"][0]["docs"] == 45
    assert m2["sources"][0]["chars"] == m["sources"][0]["chars"]
    assert snapshot(tmp_path / "reader" / "code").keys() == snapshot(tmp_path / "list" / "code").keys()
    for name, data in snapshot(tmp_path / "list" / "code").items():
        if name != "manifest.json":
            assert snapshot(tmp_path / "reader" / "code")[name] == data, name


def test_the_kernel_tree_source_reads_its_deb_on_every_call(tmp_path, monkeypatch):
    inner = tar_bytes({"linux-source-6.1/kernel/fork.c": b"int nr_threads;\n",
                       "linux-source-6.1/lib/gen.c": b"/* Autogenerated file, DO NOT EDIT */\nint f;\n"})
    deb = make_deb(tmp_path / "linux-source-6.1_6.1.1-1_all.deb", {"./usr/src/linux-source-6.1.tar.xz": inner})

    class Reg:
        def apt_newest(self, *a):
            return "linux-source-6.1"

        def deb(self, pkg):
            return Fetched("debian", pkg, "6.1.1-1", deb)

    tree = sources_mod.code_sources()[0]
    files, read = tree.get(Reg())
    assert callable(read) and "files" not in files[0].record()
    want = [("linux-source-6.1:linux-source-6.1/kernel/fork.c", b"int nr_threads;\n")]
    assert list(read()) == want and list(read()) == want
    assert files[0].record()["files"] == {"kept": 1, "generated": 1}


def test_near_duplicates_are_found_in_the_streaming_scan():
    """scan() finds the near-duplicates as it reads (a generator, read once), as find_near_duplicates
    does on a list; they are dropped with the non-text documents and counted out of the long ones."""
    text = code_like(0, 60)
    blob = "\n".join(f"{i:04d}" + "QUJDx1y2" * 9 for i in range(100))  # base64-like lines: non-text
    docs = [("a", text), ("blob", blob), ("a-copy", text.replace("\t", "    ") + "/* v2 */"),
            ("empty", " "), ("b", code_like(1, 60)), ("blob-again", blob + "\nZz9"), ("a-again", text + " x")]
    passes = []

    def records():
        passes.append(1)
        yield from docs

    d = scan("docs", records, keep_non_text=False, min_bytes=1000, near_dup=True)
    assert len(passes) == 1 and len(d) == 6  # the empty one is cleaned away
    assert list(d.drop) == [1, 2, 4, 5]  # the two blobs (non-text), two copies of "a"
    assert d.near_dup["docs_checked"] == 4 and d.near_dup["docs_dropped"] == 2
    assert {(x["doc"], x["of"]) for x in d.near_dup["near_duplicate_docs"]} == {("a-copy", "a"), ("a-again", "a")}
    assert d.long_bytes == 2  # "a" and "b"; the dropped ones do not count
    cleaned = [x for x in docs if x[0] != "empty"]
    drop, record = find_near_duplicates(cleaned, skip=[1, 4])
    assert list(drop) == [2, 5] and record == d.near_dup
    # --keep-non-text: the non-text documents stay, and are checked for near-duplicates too
    kept = scan("docs", records, keep_non_text=True, near_dup=True)
    assert list(kept.drop) == [2, 4, 5] and kept.near_dup["docs_checked"] == 6
    assert scan("docs", records, keep_non_text=False).near_dup is None
