"""train.documents=masked: the loader's windows carry each token's document (whole documents of the
stream, EOS between), read the same on a resume, and a corpus with one document is refused."""

from pathlib import Path

import numpy as np
import pytest
import torch

from lenx.attention.masks import positions
from lenx.config import ConfigError, RunConfig, validate
from lenx.data import open_corpus
from lenx.data.build import prepare_corpus
from lenx.training import distributed
from lenx.training.batches import Batches, document_ids, document_starts, train_batches


def texts(folder: Path, sizes: list[int], seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    folder.mkdir(parents=True)
    for i, n in enumerate(sizes):
        (folder / f"d{i:03d}.txt").write_text(" ".join(rng.choice(words, n)))
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A text corpus of 300 documents of 3 to 120 words (several in each training window)."""
    root = tmp_path_factory.mktemp("docs")
    sizes = np.random.default_rng(1).integers(3, 120, 300).tolist()
    prepare_corpus("docs", root / "data", from_path=texts(root / "texts", sizes), vocab_size=300, val_frac=0.2,
                   test_frac=0.1, progress=False)
    return open_corpus("docs", root / "data")


def masked(**train):
    cfg = RunConfig()
    cfg.train.documents = "masked"
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return cfg.train


def test_document_ids_by_hand():
    # documents start at 0, 3, 4 and 10: the token at 3 is the EOS of none, its own one-token document
    ids = document_ids(np.array([0, 3, 4, 10]), np.array([2, 8]), 5)
    assert ids.tolist() == [[0, 1, 2, 2, 2], [2, 2, 3, 3, 3]]


@pytest.mark.parametrize("sampling", ["random", "pass"])
def test_windows_hold_whole_documents_with_eos_between(corpus, sampling):
    t = masked(seq_len=256, batch_size=8, steps=4, sampling=sampling, pass_block=2)
    batches = train_batches(t, corpus, distributed.DistInfo(), 0, t.steps)
    tokens, docs, eos = corpus.tokens("train"), corpus.docs("train"), corpus.eos_id
    starts = batches.starts(1)
    x, y, ids = batches.get(1, 0, "cpu")
    assert ids.shape == x.shape == (8, 256) and ids.dtype == torch.int64
    pos = positions(ids)
    whole = 0
    for row, s in enumerate(starts):
        row_ids = ids[row].numpy()
        assert (np.diff(row_ids) >= 0).all()
        for d in np.unique(row_ids):
            at = np.flatnonzero(row_ids == d)
            start, length = docs[d]
            # the document's tokens in order, its EOS last, each at its position in the document
            assert (at == np.arange(at[0], at[-1] + 1)).all()
            assert (x[row, at].numpy() == tokens[s + at[0]:s + at[-1] + 1]).all()
            assert (pos[row, at].numpy() == np.arange(len(at))).all()
            if at[0] > 0:  # begun in this window: the token before is the EOS of the previous document
                assert s + at[0] == start and x[row, at[0] - 1] == eos
            if at[-1] < 255:  # ended in this window: with its EOS
                assert x[row, at[-1]] == eos and s + at[-1] == start + length
                whole += at[0] > 0
    assert whole >= 8  # the windows hold several whole documents


def test_a_resumed_run_reads_the_same_windows(corpus):
    """The batch of a step is a function of the seed and the step: a loader built afresh (a resume)
    reads the same tokens and document ids, also through a length warm-up's pieces."""
    t = masked(seq_len=128, batch_size=4, grad_accum=2, steps=8, seq_len_warmup=4, seq_len_start=32)
    one = train_batches(t, corpus, distributed.DistInfo(), 0, 8)
    again = train_batches(t, corpus, distributed.DistInfo(), 5, 8)
    for step in (1, 5, 7):
        for micro in (0, 1):
            a, b = one.get(step, micro, "cpu"), again.get(step, micro, "cpu")
            assert len(a) == 3 and all(torch.equal(u, v) for u, v in zip(a, b))
    x, _, ids = one.get(1, 0, "cpu")  # a warm-up step: pieces of 32 tokens, ids cut with them
    whole = one.documents(1, 0)
    assert x.shape == ids.shape == (2 * 4, 32) and torch.equal(ids, whole)
    stream = Batches(corpus.tokens("train"), 128, 4, 2, 0, distributed.DistInfo())
    assert len(stream.get(1, 0, "cpu")) == 2  # train.documents=stream: no ids


def test_a_corpus_with_one_document_is_refused(tmp_path):
    prepare_corpus("one", tmp_path / "data", from_path=texts(tmp_path / "texts", [3000, 40, 40]), vocab_size=300,
                   val_frac=0.34, test_frac=0.33, progress=False)
    one = open_corpus("one", tmp_path / "data")
    assert len(one.docs("train")) == 1
    with pytest.raises(ConfigError, match=r"train.documents=\"masked\".* is 1 document \(no boundaries\)") as e:
        document_starts(masked(), one, "train")
    assert "\n" not in str(e.value)
    stream = masked()
    stream.documents = "stream"
    assert document_starts(stream, one, "train") is None


def test_an_unknown_documents_value_is_refused():
    cfg = RunConfig()
    cfg.train.documents = "packed"
    with pytest.raises(ConfigError, match="train.documents must be one of stream, masked"):
        validate(cfg)
