"""The corpus reader, lenx.data: open a prepared corpus, read its splits, check it, fingerprint it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from corpus_helpers import TEXTS, split_texts
from lenx.data import CORPORA, DataError, open_corpus
from lenx.data.build import prepare_corpus
from lenx.data.build.clean import normalise
from lenx.data.layout import fingerprint_changes


def test_folder_corpus_roundtrip_and_packing(folder_corpus):
    root, m = folder_corpus
    c = open_corpus("mine", root)
    assert c.manifest == m and c.tokenizer() is not None and c.eos_id == 0
    assert c.vocab_size == m["tokenizer"]["vocab_size"] <= 400
    # 13 files: hidden one ignored; png skipped; empty and duplicate dropped.
    assert m["sources"][0]["files"] == 12 and m["sources"][0]["files_skipped_not_text"] == 1
    assert m["cleaning"] == {"docs_read": 11, "empty_dropped": 1, "duplicates_dropped": 1,
                             "not_utf8_kept_with_replacements": 0, "docs_kept": 9}
    files = [p for p in TEXTS.rglob("*") if p.is_file() and ".hidden" not in p.parts and p.suffix != ".png"]
    originals = {normalise(p.read_bytes()) for p in files if p.read_text().strip()}
    seen = []
    for split in ("train", "val", "test"):
        toks, idx = c.tokens(split), c.docs(split)
        assert toks.dtype == np.uint16 and idx.dtype == np.int64
        assert len(toks) == m["splits"][split]["tokens"] == idx[:, 1].sum() + len(idx)
        # Documents are back to back, each followed by exactly one EOS.
        assert (idx[:, 0] == np.concatenate([[0], np.cumsum(idx[:-1, 1] + 1)])).all()
        assert (toks[idx[:, 0] + idx[:, 1]] == c.eos_id).all()
        assert (toks == c.eos_id).sum() == len(idx)
        texts = split_texts(c, split)
        assert all(c.decode(c.encode(t)) == t for t in texts)
        seen += texts
        assert m["splits"][split]["docs"] >= 1
    assert len(seen) == len(set(seen)) == 9  # no document in two splits, none lost
    assert set(seen) == originals
    crlf = next(t for t in seen if t.startswith("Line one"))
    assert "\r" not in crlf
    weird = next(t for t in seen if t.startswith("Ünïcödé"))
    assert "<|endoftext|>" in weird  # literal marker stays text, not an EOS
    assert (root / "mine" / "tokenizer.json").is_file()
    assert not [p for p in (root / "mine").iterdir() if ".tmp-" in p.name]


def test_unknown_corpus_suggests_nearest(tmp_path):
    with pytest.raises(DataError, match="unknown corpus 'tehc'; did you mean 'tech'") as e:
        prepare_corpus("tehc", tmp_path)
    assert all(n in str(e.value) for n in CORPORA) and "\n" not in str(e.value)
    with pytest.raises(DataError, match="did you mean 'books'"):
        open_corpus("bokks", tmp_path)


def test_missing_and_corrupt_corpus(tmp_path):
    with pytest.raises(DataError, match=r"not prepared yet.*run `lenx prepare books`"):
        open_corpus("books", tmp_path)
    prepare_corpus("synthetic", tmp_path, progress=False)
    folder = tmp_path / "synthetic"
    with open(folder / "val.bin", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(DataError, match=r"corrupt: val.bin has 1000 bytes, manifest says \d+; delete"):
        open_corpus("synthetic", tmp_path)
    (folder / "manifest.json").write_text("{ not json")
    with pytest.raises(DataError, match="not prepared yet"):
        open_corpus("synthetic", tmp_path)


def write_token_corpus(folder: Path, splits: dict[str, list[list[int]]], eos_id: int = 9) -> dict:
    """A token-level corpus written by hand, as lenx.data.layout describes its files (no builder)."""
    folder.mkdir(parents=True)
    manifest = {"format": "lenx-corpus-v1", "name": folder.name, "kind": "synthetic", "splits": {},
                "tokenizer": {"kind": "none", "vocab_size": 10, "eos_id": eos_id, "eos_token": None}}
    for split, docs in splits.items():
        stream, index = [], []
        for doc in docs:
            index.append((len(stream), len(doc)))
            stream += doc + [eos_id]
        (folder / f"{split}.bin").write_bytes(np.array(stream, dtype="<u2").tobytes())
        np.save(folder / f"{split}.idx.npy", np.array(index, dtype=np.int64).reshape(-1, 2))
        manifest["splits"][split] = {"docs": len(docs), "tokens": len(stream)}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return manifest


TOY = {"train": [[1, 2, 3], [4, 5]], "val": [], "test": [[8, 7, 6, 5]]}


def test_a_token_level_corpus_reads_as_written(tmp_path):
    write_token_corpus(tmp_path / "toy", TOY)
    c = open_corpus("toy", tmp_path)
    assert c.vocab_size == 10 and c.eos_id == 9 and c.tokenizer() is None
    assert c.tokens("train").tolist() == [1, 2, 3, 9, 4, 5, 9] and c.docs("train").tolist() == [[0, 3], [4, 2]]
    assert c.tokens("val").tolist() == [] and c.docs("val").shape == (0, 2)
    assert c.decode([1, 2, 9]) == "1 2 <eos>"
    with pytest.raises(DataError, match="token-level"):
        c.encode("text")
    with pytest.raises(DataError, match="unknown split 'dev'; use one of train, val, test"):
        c.tokens("dev")


def test_fingerprints_are_pinned(tmp_path):
    """Runs record their corpus's fingerprint: computed from the files of a corpus whose manifest has
    none (one prepared before manifests recorded it), it must stay what it always was."""
    manifest = write_token_corpus(tmp_path / "toy", TOY)
    pinned = {"tokenizer": None,
              "train": "726685ad0edfeb34943a4047336fccda0a23a6e906b57598e3c6342e8aadab14",
              "val": "f5d90921cbebc003ad43308aa0aeee0c14488d31a6133170115932b3ec2811db",
              "test": "b37f6dc48c6d0d3b82387d36f8914597a40a21954203281ad0223607fd4df333"}
    assert open_corpus("toy", tmp_path).fingerprint() == pinned
    # A fingerprint the manifest records is the corpus's.
    recorded = dict(pinned, train="0" * 64)
    (tmp_path / "toy" / "manifest.json").write_text(json.dumps(manifest | {"fingerprint": recorded}))
    assert open_corpus("toy", tmp_path).fingerprint() == recorded
    assert fingerprint_changes(recorded, pinned) == ["train split"]
    assert fingerprint_changes(pinned, dict(pinned, tokenizer="1" * 64, test="2" * 64)) == ["tokenizer", "test split"]
