"""The RULER-style / BABILong-style suite: instances, solvability and the oracle / random / uniform anchors."""

from contextlib import nullcontext
import math

import numpy as np
import pytest

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
