"""Fixtures of the export tests: a small text corpus, a tiny run trained on it, and its export."""

import json
from pathlib import Path

import numpy as np
import pytest

WORDS = "river stone light north garden paper silver window market orchard".split()
TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=32", "train.batch_size=4",
        "train.steps=2", "train.keep_every=1", "train.log_every=1", "train.device=cpu", "data.corpus='words'"]


@pytest.fixture(scope="session")
def words_root(tmp_path_factory) -> Path:
    """A data root holding the corpus "words" (byte-level BPE of 300 tokens)."""
    from lenx.data.build import prepare_corpus

    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    with open(root / "texts.jsonl", "w") as f:
        for _ in range(40):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS, 200)) + " é 0123."}) + "\n")
    prepare_corpus("words", root, from_path=root / "texts.jsonl", vocab_size=300, progress=False)
    return root


@pytest.fixture(scope="session")
def run(words_root, tmp_path_factory) -> Path:
    """A tiny RoPE run of two steps on "words", keeping the weights of both."""
    from lenx.config import load_config
    from lenx.training.loop import train

    out = tmp_path_factory.mktemp("runs") / "rope"
    train(load_config("tiny", TINY + [f"data.root={str(words_root)!r}"]), out, progress=False)
    return out


@pytest.fixture(scope="session")
def exported(run, tmp_path_factory) -> Path:
    from lenx.export.folder import export_run

    out = tmp_path_factory.mktemp("exports") / "rope"
    export_run(run, out)
    return out


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These tests run many tiny operations (decoding token by token): on a busy machine, a second
    intra-op thread makes each of them wait for the other core, many times slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
