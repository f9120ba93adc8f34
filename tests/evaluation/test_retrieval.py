"""Passkey and copy-at-distance inputs and scoring."""

from contextlib import nullcontext

import numpy as np
import pytest
import torch

from helpers import model_for, words_corpus
from lenx.config import ConfigError
from lenx.evaluation import retrieval

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return words_corpus(tmp_path_factory.mktemp("data"))


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_passkey_inputs(corpus, depth):
    cases = retrieval.passkey_inputs(corpus, "test", 300, depth, 3, seed=7)
    again = retrieval.passkey_inputs(corpus, "test", 300, depth, 3, seed=7)
    question = corpus.encode(retrieval.QUESTION)
    for case, same in zip(cases, again):
        assert len(case["input"]) == 300 and np.array_equal(case["input"], same["input"])
        assert list(case["input"][-len(question):]) == question
        text = corpus.decode(case["input"])
        assert text.count(case["key"]) == 2 and len(case["key"]) == 5
        needle = corpus.encode(f" The pass key is {case['key']}. Remember it. {case['key']} is the pass key. ")
        at = [i for i in range(300) if list(case["input"][i:i + len(needle)]) == needle]
        assert at == [round(depth * (300 - len(needle) - len(question)))]
    assert len({c["key"] for c in cases}) > 1


def test_copy_inputs(corpus):
    for depth in (0.0, 1.0):
        for case in retrieval.copy_inputs(corpus, "test", 200, depth, 2, seed=1, span=32, shown=8):
            ids = case["input"]
            assert len(ids) == 200 and np.array_equal(ids[-24:], case["targets"])
            span = ids[-32:]
            at = round(depth * (200 - 64))
            assert np.array_equal(ids[at:at + 32], span)


class Oracle(torch.nn.Module):
    """Predicts the true next token of one known sequence (or a wrong one): checks the alignment."""

    def __init__(self, seq, vocab, wrong=False):
        super().__init__()
        self.seq, self.vocab, self.wrong = torch.as_tensor(seq), vocab, wrong
        self.w = torch.nn.Parameter(torch.zeros(1))

    def hidden(self, ids):
        nxt = self.seq[1:ids.shape[1] + 1] + int(self.wrong)
        return torch.nn.functional.one_hot(nxt % self.vocab, self.vocab).float()[None]

    def lm_head(self, h):
        return h


def test_copy_scoring_is_aligned(corpus):
    case = retrieval.copy_inputs(corpus, "test", 128, 0.5, 1, seed=2)[0]
    cpu = torch.device("cpu")
    right = retrieval._copy_cell(Oracle(case["input"], corpus.vocab_size), [case], cpu, nullcontext)
    wrong = retrieval._copy_cell(Oracle(case["input"], corpus.vocab_size, wrong=True), [case], cpu, nullcontext)
    assert right["accuracy"] == 1.0 and wrong["accuracy"] == 0.0


def test_run_task_grid_and_passkey_exact_match(corpus, monkeypatch):
    model = model_for("rope")
    model.lm_head = torch.nn.Linear(16, corpus.vocab_size, bias=False).double()
    model.wte = torch.nn.Embedding(corpus.vocab_size, 16).double()
    model.float()
    res = retrieval.run_task(model, corpus, "copy", [96, 128], depths=(0.0, 1.0), samples=2, seed=3)
    assert np.array(res["accuracy"]).shape == (2, 2)
    import lenx.model.generate as gen

    key_of = {}

    def fake_generate(model, prompt, n, **kw):
        key = key_of[prompt.shape[1]]
        return {"tokens": torch.tensor([corpus.encode(f" {key}")])}

    cases = retrieval.passkey_inputs(corpus, "test", 200, 0.5, 1, seed=3)
    key_of[200] = cases[0]["key"]
    monkeypatch.setattr(gen, "generate", fake_generate)
    res = retrieval.run_task(model, corpus, "passkey", [200], depths=(0.5,), samples=1, seed=3)
    assert res["exact"] == [[1.0]] and res["logprob"][0][0] < 0
    key_of[200] = "12345" if cases[0]["key"] != "12345" else "54321"
    assert retrieval.run_task(model, corpus, "passkey", [200], depths=(0.5,), samples=1, seed=3)["exact"] == [[0.0]]


def test_bad_requests(corpus):
    with pytest.raises(ConfigError, match="too short"):
        retrieval.copy_inputs(corpus, "test", 40, 0.5, 1, seed=0)
    with pytest.raises(ConfigError, match="unknown task"):
        retrieval.run_task(model_for("rope"), corpus, "haystack", [100])
