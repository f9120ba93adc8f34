"""`lenx prepare --tokenizer PATH`: the user's tokenizer (a tokenizer.json or a transformers folder)
instead of a trained one, and uint32 token files for a vocabulary over 65536 ids."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from corpus_helpers import split_texts
from lenx.data import DataError, open_corpus
from lenx.data.build import prepare_corpus
from lenx.data.build.tokenizer_file import open_tokenizer
from lenx.data.layout import dtype_for_vocab, tokens_file

SRC = Path(__file__).resolve().parents[3] / "src"


def word_tokenizer(n_words: int, eos: str | None = "<|endoftext|>") -> Tokenizer:
    """A word-level tokenizer of the words w0 .. w{n-1} (their ids are 2 + n), [UNK] and EOS."""
    vocab = {"[UNK]": 0, **({eos: 1} if eos else {}), **{f"w{i}": i + 2 for i in range(n_words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def word_docs(path: Path, n_words: int, n_docs: int = 30) -> list[str]:
    rng = np.random.default_rng(0)
    docs = [" ".join(f"w{i}" for i in rng.integers(0, n_words, 20 + 7 * d)) for d in range(n_docs)]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    return docs


def test_a_vocabulary_over_65536_ids_is_stored_as_uint32(tmp_path):
    assert dtype_for_vocab(65536) == "uint16" and dtype_for_vocab(65537) == "uint32"
    word_tokenizer(70000).save(str(tmp_path / "words.json"))
    docs = word_docs(tmp_path / "docs.jsonl", 70000)
    m = prepare_corpus("big", tmp_path / "data", from_path=tmp_path / "docs.jsonl",
                       tokenizer=str(tmp_path / "words.json"), progress=False)
    assert m["token_dtype"] == "uint32" and m["tokenizer"]["vocab_size"] == 70002
    assert m["tokenizer"]["kind"] == "file" and m["tokenizer"]["eos_token"] == "<|endoftext|>"
    assert m["params"]["vocab_size"] == 70002 and m["params"]["tokenizer"] == str(tmp_path / "words.json")
    c = open_corpus("big", tmp_path / "data")
    tokens = c.tokens("train")
    assert tokens.dtype == np.uint32 and tokens.max() > 65535 and c.eos_id == 1
    assert tokens_file(c.root, "train").stat().st_size == 4 * m["splits"]["train"]["tokens"]
    texts = sum((split_texts(c, s) for s in ("train", "val", "test")), [])
    assert sorted(texts) == sorted(docs)  # word-level decoding joins words with spaces, as they were
    assert all(c.encode(t) == [int(w[1:]) + 2 for w in t.split()] for t in texts[:3])
    # Training and evaluation read the stream as int64.
    from lenx.evaluation.evaluate import eval_windows

    windows, _ = eval_windows(c, "train", 16, 4, seed=0)
    assert windows.dtype == np.int64 and windows.max() > 65535
    # A damaged uint32 file is found by its size.
    with open(tokens_file(c.root, "test"), "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(DataError, match=r"test.bin has \d+ bytes, manifest says"):
        open_corpus("big", tmp_path / "data")


def test_the_corpus_tokenizer_is_the_given_one(tmp_path):
    tok = word_tokenizer(50)
    tok.enable_truncation(8)  # a tokenizer.json may carry truncation: documents are encoded whole all the same
    tok.save(str(tmp_path / "words.json"))
    docs = word_docs(tmp_path / "docs.jsonl", 50)
    root = tmp_path / "data"
    m = prepare_corpus("mine", root, from_path=tmp_path / "docs.jsonl", tokenizer=str(tmp_path / "words.json"),
                       progress=False)
    c = open_corpus("mine", root)
    assert m["token_dtype"] == "uint16" and max(c.docs("train")[:, 1]) > 8
    assert sorted(sum((split_texts(c, s) for s in ("train", "val", "test")), [])) == sorted(docs)
    saved = Tokenizer.from_file(str(root / "mine" / "tokenizer.json"))
    assert saved.get_vocab() == word_tokenizer(50).get_vocab() and saved.truncation is None
    sha = m["params"]["tokenizer_sha256"]
    assert m["tokenizer"]["sha256"] == sha and m["tokenizer"]["source"] == str(tmp_path / "words.json")
    # The same tokenizer again: prepared already. Another one at that path: other settings.
    before = (root / "mine" / "train.bin").stat().st_mtime_ns
    assert prepare_corpus("mine", root, from_path=tmp_path / "docs.jsonl", tokenizer=str(tmp_path / "words.json"),
                          progress=False) == m
    assert (root / "mine" / "train.bin").stat().st_mtime_ns == before
    word_tokenizer(60).save(str(tmp_path / "words.json"))
    with pytest.raises(DataError, match=r"other settings: tokenizer_sha256 '[0-9a-f]{64}', now '[0-9a-f]{64}'; "
                                        r"vocab_size 52, now 62.*pass --force"):
        prepare_corpus("mine", root, from_path=tmp_path / "docs.jsonl", tokenizer=str(tmp_path / "words.json"),
                       progress=False)


def test_a_transformers_tokenizer_folder(tmp_path):
    transformers = pytest.importorskip("transformers")
    docs = word_docs(tmp_path / "docs.jsonl", 50)
    # A folder with tokenizer.json: the eos_token of its tokenizer_config.json is EOS.
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=word_tokenizer(50, eos="</s>"), eos_token="</s>")
    fast.save_pretrained(str(tmp_path / "fast"))
    m = prepare_corpus("fast", tmp_path / "data", from_path=tmp_path / "docs.jsonl", tokenizer=str(tmp_path / "fast"),
                       progress=False)
    assert m["tokenizer"]["eos_token"] == "</s>" and m["tokenizer"]["eos_id"] == 1
    c = open_corpus("fast", tmp_path / "data")
    assert sorted(sum((split_texts(c, s) for s in ("train", "val", "test")), [])) == sorted(docs)
    # A folder of a tokenizer's own files (GPT-2's vocab.json and merges.txt): transformers builds it.
    from tokenizers import pre_tokenizers as pre

    vocab = {ch: i for i, ch in enumerate(sorted(pre.ByteLevel.alphabet()))} | {"th": 256, "the": 257,
                                                                               "<|endoftext|>": 258}
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "vocab.json").write_text(json.dumps(vocab))
    (slow / "merges.txt").write_text("#version: 0.2\nt h\nth e\n")
    (slow / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
    (tmp_path / "the.jsonl").write_text("".join(json.dumps({"text": f"the theory of the {i}th"}) + "\n"
                                                for i in range(20)))
    m = prepare_corpus("slow", tmp_path / "data", from_path=tmp_path / "the.jsonl", tokenizer=str(slow),
                       progress=False)
    assert m["tokenizer"]["eos_token"] == "<|endoftext|>" and m["tokenizer"]["eos_id"] == 258
    c = open_corpus("slow", tmp_path / "data")
    assert c.encode("the") == [257] and c.decode(c.encode("the theory")) == "the theory"


def test_tokenizer_errors_are_one_line(tmp_path):
    word_docs(tmp_path / "docs.jsonl", 50)
    kw = dict(from_path=tmp_path / "docs.jsonl", progress=False)
    word_tokenizer(50, eos=None).save(str(tmp_path / "no_eos.json"))
    with pytest.raises(DataError, match=r"needs an end-of-text token between documents, and it has none of "
                                        r"<\|endoftext\|>, </s>"):
        prepare_corpus("x", tmp_path / "data", tokenizer=str(tmp_path / "no_eos.json"), **kw)
    (tmp_path / "broken.json").write_text("{not a tokenizer")
    with pytest.raises(DataError, match=r"cannot read .*broken.json as a tokenizers tokenizer.json"):
        prepare_corpus("x", tmp_path / "data", tokenizer=str(tmp_path / "broken.json"), **kw)
    word_tokenizer(50).save(str(tmp_path / "words.json"))
    with pytest.raises(DataError, match=r"--vocab-size applies to the BPE trained here"):
        prepare_corpus("x", tmp_path / "data", tokenizer=str(tmp_path / "words.json"), vocab_size=300, **kw)
    with pytest.raises(DataError, match=r"unknown tokenizer 'nothing/here.json'"):
        prepare_corpus("x", tmp_path / "data", tokenizer="nothing/here.json", **kw)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"cannot load a tokenizer from .*empty"):
        prepare_corpus("x", tmp_path / "data", tokenizer=str(tmp_path / "empty"), **kw)
    assert not (tmp_path / "data" / "x").exists()


def test_a_tokenizer_folder_without_transformers_says_how_to_install(tmp_path, monkeypatch):
    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "vocab.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "transformers", None)  # an import of it fails, as when it is not installed
    with pytest.raises(DataError, match=r"holds no tokenizer.json; reading its transformers tokenizer needs "
                                        r"transformers: pip install 'lenx\[hf\]'$"):
        open_tokenizer(str(tmp_path / "slow"))
    word_tokenizer(5).save(str(tmp_path / "slow" / "tokenizer.json"))  # a tokenizer.json needs only tokenizers
    assert open_tokenizer(str(tmp_path / "slow"))[1]["vocab_size"] == 7


def test_prepare_cli_with_a_tokenizer_and_parquet(tmp_path):
    """As a user runs it: relative paths from another working directory, --text-field, --tokenizer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    work = tmp_path / "work"
    (work / "inputs").mkdir(parents=True)
    rng = np.random.default_rng(1)
    docs = [" ".join(f"w{i}" for i in rng.integers(0, 50, 30 + d)) for d in range(30)]
    pq.write_table(pa.table({"body": docs}), work / "inputs" / "docs.parquet")
    word_tokenizer(50).save(str(work / "inputs" / "words.json"))
    here = work / "elsewhere"
    here.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "lenx", "prepare", "mine", "--from", "../inputs/docs.parquet",
                          "--text-field", "body", "--tokenizer", "../inputs/words.json", "--root", "../data",
                          "--no-progress"], capture_output=True, text=True, timeout=600, cwd=here, env=env)
    assert out.returncode == 0, out.stderr
    m = json.loads((work / "data" / "mine" / "manifest.json").read_text())  # stdout: a summary
    assert m["params"]["text_field"] == "body" and m["params"]["tokenizer"] == str(work / "inputs" / "words.json")
    assert m["tokenizer"]["sha256"] == m["params"]["tokenizer_sha256"] == hashlib.sha256(
        Tokenizer.from_file(str(work / "inputs" / "words.json")).to_str().encode()).hexdigest()
    assert open_corpus("mine", work / "data").manifest["splits"] == m["splits"]
    out = subprocess.run([sys.executable, "-m", "lenx", "prepare", "other", "--from", "../inputs/docs.parquet",
                          "--root", "../data"], capture_output=True, text=True, timeout=600, cwd=here, env=env)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "has no column \"text\" (its columns: body); name the text column with --text-field" in out.stderr
    helped = subprocess.run([sys.executable, "-m", "lenx", "prepare", "--help"], capture_output=True, text=True,
                            timeout=600, env={**env, "COLUMNS": "200"})
    assert all(opt in helped.stdout for opt in ("--text-field", "--split", "--tokenizer", "hf:NAME"))
