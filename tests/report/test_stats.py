"""Bootstrap intervals over documents."""

import math

import numpy as np
import pytest

from lenx.report.stats import seed_mean_difference, seed_mean_interval


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


# --- method differences over seeds and documents ------------------------------------------------------

from lenx.report.stats import (document_shares, document_win_rate, leave_one_document_out, method_difference,  # noqa: E402
                        window_summary)


def simulated(rng, seeds=3, documents=30, per_doc=2, sd_seed=0.05, sd_doc=0.5, sd_inter=0.05, sd_noise=0.2,
              delta=0.03):
    """Two methods' window NLLs [seeds, windows] on shared windows: a shared document effect, a
    method-by-document effect, a seed effect per (method, seed), window noise; a is worse by delta
    (the truth for the mean-NLL difference)."""
    docs = np.repeat(np.arange(documents), per_doc)
    doc = rng.normal(0, sd_doc, documents)[docs]

    def method(mu):
        inter = rng.normal(0, sd_inter, documents)[docs]
        return mu + doc + inter + rng.normal(0, sd_seed, (seeds, 1)) + rng.normal(0, sd_noise, (seeds, len(docs)))

    return method(delta), method(0.0), docs


@pytest.mark.parametrize("seeds,sd_seed", [(2, 0.05), (3, 0.05), (3, 0.15), (5, 0.05)])
def test_method_difference_covers_the_truth(seeds, sd_seed):
    """Over 400 simulated experiments with known seed and document variation, the 95 % interval of
    the mean-NLL difference holds the true difference 92-99 % of the time (a percentile bootstrap
    that resamples seeds within methods held it 85-92 % of the time with 2-3 seeds)."""
    rng = np.random.default_rng(seeds * 100 + int(sd_seed * 100))
    hits = 0
    for _ in range(400):
        a, b, docs = simulated(rng, seeds=seeds, sd_seed=sd_seed)
        r = method_difference(a, b, docs, n=400, seed=int(rng.integers(1 << 30)), scale="nll")
        hits += r["lo"] <= 0.03 <= r["hi"]
    assert 0.92 <= hits / 400 <= 0.99, hits / 400


def test_method_difference_reports_its_parts():
    rng = np.random.default_rng(5)
    a, b, docs = simulated(rng, seeds=3, sd_seed=0.2, delta=0.5)
    r = method_difference(a, b, docs, scale="nll")
    assert math.isclose(r["diff"], a.mean() - b.mean()) and r["lo"] > 0
    assert r["covers"] == "seeds and documents" and r["seed_sd_a"] > 0.05 and r["var_seeds"] > 0
    ppl = method_difference(a, b, docs)
    assert math.isclose(ppl["diff"], np.exp(a.mean(1)).mean() - np.exp(b.mean(1)).mean())
    one = method_difference(a[:1], b, docs)
    assert one["covers"] == "documents only" and one["seed_sd_a"] is None
    # the same experiment with no seed effect: the seeds' part and the interval shrink
    a0, b0, _ = simulated(np.random.default_rng(5), seeds=3, sd_seed=0.0, delta=0.5)
    calm = method_difference(a0, b0, docs, scale="nll")
    assert calm["var_seeds"] < r["var_seeds"] / 4 and calm["hi"] - calm["lo"] < r["hi"] - r["lo"]
    with pytest.raises(ValueError, match="scale"):
        method_difference(a, b, docs, scale="log")


def test_a_document_that_decides_a_verdict_is_named():
    """a is better everywhere but on one document, where it is far worse: with that document the
    interval holds 0, without it a is lower. Leave-one-out names the document, and it carries the
    largest share of the difference."""
    rng = np.random.default_rng(7)
    a, b, docs = simulated(rng, seeds=3, documents=40, sd_seed=0.01, delta=-0.1)
    a[:, docs == 11] += 4.0
    shares = document_shares(a, b, docs)
    assert shares[0]["document"] == 11 and math.isclose(sum(s["share"] for s in shares), (a - b).mean())
    loo = leave_one_document_out(a, b, docs, n=300, scale="nll")
    assert loo["verdict"] == "no difference"
    assert [f["document"] for f in loo["flips"]] == [11] and loo["flips"][0]["verdict"] == "a lower"


def test_window_summary_and_win_rate():
    docs = np.array([0, 0, 1, 2])
    a = np.array([[1.0, 2.0, 12.0, 3.0]])
    b = np.array([[2.0, 2.0, 11.0, 4.0]])
    s = window_summary(a, docs, vocab_size=16384)  # ln 16384 = 9.70
    assert s["median_nll"] == 2.5 and s["above_uniform_windows"] == 1 and s["above_uniform_documents"] == [1]
    assert document_win_rate(a, b, docs) == pytest.approx(2 / 3)  # a wins documents 0 and 2
