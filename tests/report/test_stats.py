"""Intervals over documents and training seeds (lenx.report.stats)."""

import math

import numpy as np
import pytest

from lenx.report.stats import (delta_p_difference, document_shares, document_win_rate, leave_one_document_out,
                               method_difference, method_interval, same_seeds_difference, window_summary)


def test_interval_brackets_the_estimate_and_is_seeded():
    rng = np.random.default_rng(0)
    docs = np.repeat(np.arange(20), 3)
    nll = 3 + 0.3 * rng.standard_normal(60) + 0.5 * rng.standard_normal(20)[docs]
    a = method_interval(nll, docs, seed=1)
    assert a == method_interval(nll, docs, seed=1)
    assert a["lo"] < a["value"] < a["hi"] and math.isclose(a["value"], math.exp(nll.mean()))
    assert a["covers"] == "documents only" and a["seed_sd"] is None
    three = method_interval(nll + 0.1 * rng.standard_normal((3, 1)), docs, seed=1)
    assert three["covers"] == "seeds and documents" and three["seed_sd"] > 0 and len(three["per_seed"]) == 3


def test_a_perplexity_interval_stays_positive():
    """Two seeds of a failing method far apart (RoPE at 16 x its training length: perplexities near 90
    and 180): a t interval on the perplexity itself would reach below zero; the mean NLL's, exponentiated,
    holds the seed mean and stays above zero."""
    rng = np.random.default_rng(5)
    docs = np.arange(64)
    nll = np.log([[90.0], [180.0]]) + 0.3 * rng.standard_normal((2, 64))
    r = method_interval(nll, docs)
    assert 0 < r["lo"] < r["value"] < r["hi"] and r["covers"] == "seeds and documents"
    assert math.isclose(r["value"], float(np.mean(r["per_seed"])))


def test_windows_of_one_document_are_not_independent():
    """The same NLLs, once as 60 documents and once as 6 documents of 10 windows each: clustering by
    document must widen the interval when documents differ."""
    rng = np.random.default_rng(2)
    doc_effect = np.repeat(rng.standard_normal(6), 10)
    nll = 3 + doc_effect + 0.05 * rng.standard_normal(60)
    wide = method_interval(nll, np.repeat(np.arange(6), 10))
    narrow = method_interval(nll, np.arange(60))
    assert wide["hi"] - wide["lo"] > 1.5 * (narrow["hi"] - narrow["lo"])


def test_same_seeds_difference():
    rng = np.random.default_rng(3)
    docs = np.repeat(np.arange(30), 2)
    a = 3 + rng.standard_normal((3, 60))
    same = same_seeds_difference(a, a, docs)
    assert (same["diff"], same["lo"], same["hi"]) == (0.0, 0.0, 0.0)
    better = same_seeds_difference(a, a - 0.1, docs)  # b is better on every window by the same margin
    assert better["diff"] > 0 and better["lo"] > 0 and better["covers"] == "seeds and documents"
    with pytest.raises(ValueError, match="paired windows"):
        same_seeds_difference(a, a[:, :10], docs)
    with pytest.raises(ValueError, match="same seeds"):
        same_seeds_difference(a, a[:2], docs)


def simulated_delta_p(rng, seeds=3, documents=30, per_doc=2, sd_seed=0.1, sd_gain=0.02, sd_doc=0.5, sd_noise=0.2,
                      gain=0.05):
    """ΔP's two terms of one method, [seeds, windows] each, in mean NLL: a seed's model is better or
    worse on both (sd_seed, shared), its gain from the longer context varies less (sd_gain), and
    each document and window adds its own; the true ΔP (short minus tail) is `gain`."""
    docs = np.repeat(np.arange(documents), per_doc)
    doc = rng.normal(0, sd_doc, documents)[docs]
    luck = rng.normal(0, sd_seed, (seeds, 1))
    short = 3 + doc + luck + rng.normal(0, sd_noise, (seeds, len(docs)))
    tail = short - gain - rng.normal(0, sd_gain, (seeds, 1)) - rng.normal(0, 0.1, documents)[docs] \
        - rng.normal(0, 0.05, (seeds, len(docs)))
    return short, tail, docs


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_delta_p_covers_the_truth(seeds):
    """ΔP's terms share each seed's luck: the interval of each seed's own difference covers the true
    ΔP about 95 % of the time, where counting the two terms' seed spreads apart (method_difference)
    covers it nearly always, with wider intervals."""
    rng = np.random.default_rng(seeds)
    hits, apart, widths = 0, 0, []
    for _ in range(300):
        short, tail, docs = simulated_delta_p(rng, seeds=seeds)
        r = same_seeds_difference(short, tail, docs, n=300, seed=int(rng.integers(1 << 30)), scale="nll")
        loose = method_difference(short, tail, docs, n=300, seed=1, scale="nll")
        hits += r["lo"] <= 0.05 <= r["hi"]
        apart += loose["lo"] <= 0.05 <= loose["hi"]
        widths.append((r["hi"] - r["lo"]) / (loose["hi"] - loose["lo"]))
    assert 0.92 <= hits / 300 <= 0.99, hits / 300
    assert apart / 300 > 0.99 and np.median(widths) < 0.6


def test_delta_p_difference_covers_the_truth():
    """Two methods' ΔP (each over its own seeds, on shared documents): the interval of the difference
    covers the true difference (0.05 - 0.02) about 95 % of the time. A document that gains from long
    context gains for both methods, so the two must be resampled with one draw of documents: drawn
    apart, the interval covers nearly always (wider than it needs to be)."""
    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(300):
        sa, ta, docs = simulated_delta_p(rng, gain=0.05)
        sb, tb, _ = simulated_delta_p(rng, gain=0.02)
        shared_gain = rng.normal(0, 0.3, 30)[docs]
        r = delta_p_difference(sa, ta - shared_gain, sb, tb - shared_gain, docs, n=300,
                               seed=int(rng.integers(1 << 30)), scale="nll")
        hits += r["lo"] <= 0.03 <= r["hi"]
    assert 0.92 <= hits / 300 <= 0.99, hits / 300


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_method_interval_covers_the_truth(seeds):
    """One method's mean NLL over its seeds (truth 3.0), documents and seeds drawn anew each time:
    the 95 % interval holds it about 95 % of the time. (With one seed it covers documents only, and
    misses the seed's own offset: ~90 % here, which is why such an interval is marked.)"""
    rng = np.random.default_rng(seeds + 40)
    hits = 0
    for _ in range(300):
        docs = np.repeat(np.arange(30), 2)
        nll = (3.0 + rng.normal(0, 0.5, 30)[docs] + rng.normal(0, 0.05, (seeds, 1))
               + rng.normal(0, 0.2, (seeds, len(docs))))
        r = method_interval(nll, docs, n=300, seed=int(rng.integers(1 << 30)), scale="nll")
        hits += r["lo"] <= 3.0 <= r["hi"]
    assert 0.92 <= hits / 300 <= 0.99, hits / 300


def test_what_an_interval_covers():
    """One seed: documents only; windows of one document: seeds only (no document spread to measure);
    both: nothing, an interval of no width."""
    rng = np.random.default_rng(8)
    many, one = np.repeat(np.arange(5), 2), np.zeros(10, dtype=int)
    three, single = 3 + 0.1 * rng.standard_normal((3, 10)), 3 + 0.1 * rng.standard_normal((1, 10))
    assert method_difference(three, three + 0.1, many)["covers"] == "seeds and documents"
    assert method_difference(single, three, many)["covers"] == "documents only"
    seeds_only = method_difference(three, three + 0.1, one)
    assert seeds_only["covers"] == "seeds only" and seeds_only["var_documents"] == 0 and seeds_only["lo"] < seeds_only["hi"]
    nothing = method_interval(single, one)
    assert nothing["covers"] == "nothing" and nothing["lo"] == nothing["value"] == nothing["hi"]


def test_bad_window_nlls_are_refused():
    docs = np.repeat(np.arange(5), 2)
    nll = np.full((2, 10), 3.0)
    with pytest.raises(ValueError, match="finite"):
        method_interval(np.where(np.arange(10) == 3, np.nan, nll), docs)


# --- method differences over seeds and documents ------------------------------------------------------



def simulated(rng, seeds=3, documents=30, per_doc=2, sd_seed=0.05, sd_doc=0.5, sd_inter=0.3, sd_noise=0.2,
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
    a, b, docs = simulated(rng, seeds=3, documents=40, sd_seed=0.01, sd_inter=0.05, delta=-0.1)
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


def test_the_resamples_are_a_bincount_per_draw_and_kept_draws_are_not_shared():
    """The one-bincount draw equals a bincount of each resample's drawn documents, at odd document counts
    and with string documents; a kept draw comes back the same, and changing a returned one changes no later one."""
    from lenx.report import stats

    for docs in (np.array([5]), np.array([1, 1, 2]), np.arange(63) % 41, np.array(["b", "a", "b", "c"] * 7)):
        _, inverse = np.unique(docs, return_inverse=True)
        k = inverse.max() + 1
        draws = np.random.default_rng(3).integers(0, k, size=(111, k))
        plain = np.stack([np.bincount(d, minlength=k) for d in draws])[:, inverse]
        w = stats._resamples(docs, 111, 3)
        assert w.dtype == np.int64 and np.array_equal(w, plain)
        w[:] = -1
        assert np.array_equal(stats._resamples(docs, 111, 3), plain)
        assert k == 1 or not np.array_equal(stats._resamples(docs, 111, 4), plain)  # one document: one draw
