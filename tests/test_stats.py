"""Bootstrap intervals over documents."""

import math

import numpy as np
import pytest

from lenx.stats import seed_mean_difference, seed_mean_interval


def test_interval_brackets_the_estimate_and_is_seeded():
    rng = np.random.default_rng(0)
    docs = np.repeat(np.arange(20), 3)
    nll = 3 + 0.3 * rng.standard_normal(60) + 0.5 * rng.standard_normal(20)[docs]
    a = seed_mean_interval(nll, docs, seed=1)
    assert a == seed_mean_interval(nll, docs, seed=1)
    assert a["lo"] < a["ppl"] < a["hi"] and math.isclose(a["ppl"], math.exp(nll.mean()))


def test_windows_of_one_document_are_not_independent():
    """The same NLLs, once as 60 documents and once as 6 documents of 10 windows each: clustering by
    document must widen the interval when documents differ."""
    rng = np.random.default_rng(2)
    doc_effect = np.repeat(rng.standard_normal(6), 10)
    nll = 3 + doc_effect + 0.05 * rng.standard_normal(60)
    wide = seed_mean_interval(nll, np.repeat(np.arange(6), 10))
    narrow = seed_mean_interval(nll, np.arange(60))
    assert wide["hi"] - wide["lo"] > 1.5 * (narrow["hi"] - narrow["lo"])


def test_seed_mean_difference():
    rng = np.random.default_rng(3)
    docs = np.repeat(np.arange(30), 2)
    a = 3 + rng.standard_normal(60)
    same = seed_mean_difference(a, a, docs)
    assert same == {"diff": 0.0, "lo": 0.0, "hi": 0.0}
    better = seed_mean_difference(a, a - 0.1, docs)  # b is better on every window by the same margin
    assert better["diff"] > 0 and better["lo"] > 0
    with pytest.raises(ValueError, match="paired windows"):
        seed_mean_difference(a, a[:10], docs)
