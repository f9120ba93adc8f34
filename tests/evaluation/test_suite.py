"""The RULER-style / BABILong-style suite: instances, solvability and the oracle / random / uniform anchors."""

from contextlib import nullcontext
import math

import numpy as np
import pytest
import torch

from helpers import model_for, words_corpus
from lenx.config import ConfigError
from lenx.evaluation import suite
from lenx.evaluation import babilong

ALL = list(suite.GENERATORS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return words_corpus(tmp_path_factory.mktemp("data"))


@pytest.mark.parametrize("task", ALL)
def test_instances_are_solvable_and_seeded(corpus, task):
    for depth in (0.0, 0.5, 1.0):
        for i in range(3):
            case = suite.build_case(corpus, task, 600, depth, i, seed=5)
            again = suite.build_case(corpus, task, 600, depth, i, seed=5)
            assert len(case["input"]) == 600 and np.array_equal(case["input"], again["input"])
            text = corpus.decode(case["input"].tolist())
            for part in case["answer_text"].replace(",", " ").split():
                assert part in text, (task, part)
            for value in case["once"]:
                assert text.count(value) == 1, (task, value)
    other = suite.build_case(corpus, task, 600, 0.5, 0, seed=6)
    assert not np.array_equal(other["input"], suite.build_case(corpus, task, 600, 0.5, 0, seed=5)["input"])


def test_babilong_answers_follow_the_facts():
    rng = np.random.default_rng(0)
    for i in range(20):
        case = babilong.qa1(rng, 1.0, i)
        who = case.question.split("Where is ")[1].split("?")[0]
        last = [t for t, _ in case.needles if t.startswith(f" {who} ")][-1]
        assert last.rstrip(". ").endswith(case.answer.strip())
        case = babilong.qa3(rng, 0.5, i)
        assert f"to the {case.answer.strip()}." in case.needles[2][0]
        assert all(d <= 0.5 for _, d in case.needles)


def _scores(corpus, model, score, tasks=ALL):
    return suite.run_suite(model, corpus, tasks, [300], [0.0, 1.0], samples=4, seed=3, score=score)["tasks"]


def test_anchors_oracle_random_uniform(corpus):
    oracle = _scores(corpus, None, lambda m, c: (1.0, 0.0))
    assert all(r["exact"] == [[1.0, 1.0]] and r["logprob"] == [[0.0, 0.0]] for r in oracle.values())
    rng = np.random.default_rng(0)

    def random_model(m, c):   # guesses the answer among the task's choices: babilong's places
        return float(rng.choice(babilong.PLACES) == c["answer_text"]), 0.0

    guessed = _scores(corpus, None, random_model, list(babilong.TASKS))
    mean = np.mean([g["exact"] for g in guessed.values()])
    assert abs(mean - babilong.CHANCE["qa1"]) < 0.2 and all(g["chance"] == 1 / 6 for g in guessed.values())
    uniform = _scores(corpus, None, lambda m, c: (0.0, -math.log(corpus.vocab_size)))
    assert all(math.isclose(r["logprob"][0][0], -math.log(corpus.vocab_size)) for r in uniform.values())


def test_real_model_scores_and_result_fields(corpus):
    model = model_for("rope", vocab_size=corpus.vocab_size)
    out = suite.run_suite(model, corpus, ["niah_single", "qa1"], [200], [0.5], samples=1, seed=3,
                          autocast=nullcontext)
    for r in out["tasks"].values():
        assert 0 <= r["exact"][0][0] <= 1 and r["logprob"][0][0] < 0 and len(r["instances"]) == 64
    assert out["generator_version"] == {"ruler": 1, "babilong": 1} and out["corpus_fingerprint"]["test"]
    again = suite.run_suite(model, corpus, ["niah_single"], [200], [0.5], samples=1, seed=3)
    assert again["tasks"]["niah_single"]["instances"] == out["tasks"]["niah_single"]["instances"]


def test_bad_input(corpus):
    assert suite.parse_tasks("ruler") == list(suite.ruler.TASKS)
    assert suite.parse_tasks("niah_single,vt") == ["niah_single", "vt"]
    with pytest.raises(ConfigError, match="unknown suite task 'nope'"):
        suite.parse_tasks("qa1,nope")
    with pytest.raises(ConfigError, match="below the niah_single task's minimum"):
        suite.build_case(corpus, "niah_single", 10, 0.5, 0, 1)
    with pytest.raises(ConfigError, match="fewer than"):
        suite.build_case(corpus, "qa1", 10 ** 7, 0.5, 0, 1)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """The token-level synthetic corpus (ids 0-254, EOS 255; no text)."""
    from lenx.data import open_corpus
    from lenx.data.build import prepare_corpus

    root = tmp_path_factory.mktemp("synthetic")
    prepare_corpus("synthetic", root, progress=False)
    return open_corpus("synthetic", root)


def _count(ids: np.ndarray, part) -> int:
    part = np.asarray(part)
    return sum(np.array_equal(ids[k:k + len(part)], part) for k in range(len(ids) - len(part) + 1))


@pytest.mark.parametrize("task", list(suite.ruler_tokens.GENERATORS))
def test_token_level_instances_are_solvable_and_seeded(tokens, task):
    for depth in (0.0, 0.5, 1.0):
        for i in range(3):
            case = suite.build_case(tokens, task, 400, depth, i, seed=5)
            again = suite.build_case(tokens, task, 400, depth, i, seed=5)
            assert case["tokens"] and len(case["input"]) == 400 and np.array_equal(case["input"], again["input"])
            assert tokens.eos_id not in case["answer"] and case["answer_text"] == tokens.decode(case["answer"])
            for t in case["answer"]:   # every answer token is in the input; stated facts exactly once
                assert t in case["input"], (task, t)
            for part in case["once"]:
                assert _count(case["input"], part) == 1, (task, part)
            if task in ("niah_single", "niah_multikey"):   # the value follows the asked key
                assert _count(case["input"], case["answer"]) >= 1
    other = suite.build_case(tokens, task, 400, 0.5, 0, seed=6)
    assert not np.array_equal(other["input"], suite.build_case(tokens, task, 400, 0.5, 0, seed=5)["input"])


def test_token_level_answers_follow_the_needles(tokens):
    rng = np.random.default_rng(0)
    symbols = np.arange(255)
    for i in range(10):
        case = suite.ruler_tokens.fwe(rng, 0.5, i, symbols)
        listing = case.needles[0][0]
        words = [tuple(listing[k:k + 2]) for k in range(2, len(listing), 3)]   # head, then word + separator
        assert max(set(words), key=words.count) == tuple(case.answer)
        case = suite.ruler_tokens.vt(rng, 1.0, i, symbols)
        first = case.needles[0][0]   # assign N1 eq VALUE: the question asks for VALUE
        assert np.array_equal(first[-3:], case.question[2:5]) and np.array_equal(first[2:4], case.answer[:2])


def test_token_level_refuses_the_reasoning_tasks(tokens):
    with pytest.raises(ConfigError, match="the qa2 task is reasoning over sentences; corpus 'synthetic' is token"):
        suite.build_case(tokens, "qa2", 400, 0.5, 0, 1)


def test_token_level_exact_match_compares_ids(tokens, monkeypatch):
    """A continuation 12 34 56 does not start with the answer 12 34 5, though its text does."""
    from lenx.model import generate as gen

    model = model_for("rope", vocab_size=tokens.vocab_size)
    case = suite.build_case(tokens, "niah_single", 100, 0.5, 0, 1)
    case["answer"] = np.array([12, 34, 5])
    case["answer_text"] = tokens.decode(case["answer"])
    for made, want in (([12, 34, 5, 7, 7], 1.0), ([12, 34, 56, 7, 7], 0.0), ([3, 12, 34, 5, 7], 0.0)):
        monkeypatch.setattr(gen, "generate", lambda *a, made=made, **k: {"tokens": torch.tensor([made])})
        exact, logprob = suite.score_case(model, case, tokens.decode, torch.device("cpu"), nullcontext)
        assert exact == want and logprob < 0


def test_token_level_suite_runs_and_records_its_generator(tokens):
    model = model_for("rope", vocab_size=tokens.vocab_size)
    out = suite.run_suite(model, tokens, ["niah_single", "cwe"], [200], [0.5], samples=1, seed=3, autocast=nullcontext)
    assert out["generator_version"] == {"ruler_tokens": 1}
    for t, r in out["tasks"].items():
        assert 0 <= r["exact"][0][0] <= 1 and r["logprob"][0][0] < 0 and r["chance"] == suite.CHANCE[t]
