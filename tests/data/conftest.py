"""Fixtures of the corpus tests."""

import pytest

from corpus_helpers import TEXTS
from lenx.data.build import prepare_corpus


@pytest.fixture(scope="module")
def folder_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    m = prepare_corpus("mine", root, from_path=TEXTS, vocab_size=400, progress=False, val_frac=0.1, test_frac=0.1)
    return root, m
