"""Splitting a corpus by document."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lenx.data import DataError
from lenx.data.build import prepare_corpus
from lenx.data.build.splits import split_docs


def test_split_by_document_is_stratified_and_seeded():
    rng = np.random.default_rng(1)
    lengths = np.exp(rng.uniform(3, 13, 2000)).astype(int)
    s = split_docs(lengths, seed=0, val_frac=0.02, test_frac=0.05)
    assert s.shape == (2000,) and set(np.unique(s)) == {0, 1, 2}
    assert abs((s == 2).sum() - 100) <= 2 and abs((s == 1).sum() - 40) <= 2
    longest = np.argsort(-lengths)[:200]  # test gets ~5% of the longest docs too
    assert 7 <= (s[longest] == 2).sum() <= 13
    assert (split_docs(lengths, 0, 0.02, 0.05) == s).all()
    assert not (split_docs(lengths, 1, 0.02, 0.05) == s).all()
    tiny = split_docs(np.array([5, 6, 7]), 0, 0.02, 0.05)
    assert sorted(tiny) == [0, 1, 2]  # every requested split gets a doc when possible


def test_split_gives_every_requested_split_a_document_when_there_are_enough():
    for fracs in ((0.02, 0.05), (0.4, 0.5), (0.0, 0.3)):
        wanted = {0} | {i + 1 for i, f in enumerate(fracs) if f > 0}
        for n in range(len(wanted), 12):
            for seed in range(30):
                assert set(split_docs(np.arange(1, n + 1), seed, *fracs)) == wanted, (fracs, n, seed)


@pytest.mark.parametrize("n", [1, 2])
def test_too_few_documents_for_the_splits_is_an_error(tmp_path, n):
    data = tmp_path / "few.jsonl"
    data.write_text("".join(json.dumps({"text": f"document number {i}"}) + "\n" for i in range(n)))
    with pytest.raises(DataError, match=rf"has {n} documents? .*needs at least 3 .*train, val and test") as e:
        prepare_corpus("few", tmp_path, from_path=data, vocab_size=300, progress=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "few").exists()
    # Without val and test splits, any document count will do.
    m = prepare_corpus("few", tmp_path, from_path=data, vocab_size=300, progress=False, val_frac=0, test_frac=0)
    assert m["splits"]["train"]["docs"] == n and m["splits"]["test"]["docs"] == 0
