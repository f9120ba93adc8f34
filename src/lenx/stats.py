"""Confidence intervals for evaluation results: a bootstrap over documents.

eval.json keeps, for every length, one mean NLL per window ("window_nll") and the document each
window's scored tokens come from ("window_documents"). Windows of one document are not independent,
so a resample draws documents with replacement and takes all of each drawn document's windows.
Differences between two methods are paired: the windows are the same for every method (they depend
only on the corpus, split and eval seed), so each resample compares the two on the same windows.
"""

import numpy as np


def _resamples(documents, n: int, seed: int):
    """For each of n resamples, the window weights: how often each window's document was drawn."""
    documents = np.asarray(documents)
    unique, inverse = np.unique(documents, return_inverse=True)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(unique), size=(n, len(unique)))
    counts = np.stack([np.bincount(d, minlength=len(unique)) for d in draws])  # [n, documents]
    return counts[:, inverse]  # [n, windows]


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _nll_rows(window_nll) -> np.ndarray:
    """[seeds, windows] float64 from one run's window NLLs ([windows]) or several seeds' ([seeds, windows])."""
    nll = np.asarray(window_nll, dtype=np.float64)
    if nll.ndim == 1:
        nll = nll[None]
    if nll.ndim != 2 or nll.shape[0] == 0 or nll.shape[1] == 0:
        raise ValueError(f"window NLLs must be [seeds, windows] with at least one of each, got shape {nll.shape}")
    return nll


def _seed_mean_ppl(nll: np.ndarray, w: np.ndarray) -> np.ndarray:
    """For each resample (row of the window weights w, [n, windows]), the mean over seeds of each
    seed's perplexity on the resampled windows: [n]."""
    return np.exp((w @ nll.T) / w.sum(1, keepdims=True)).mean(1)


def seed_mean_interval(window_nll, documents, n: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """{"ppl", "lo", "hi", "per_seed"} of runs that differ only in their training seed, measured
    on the same windows: window_nll is [seeds, windows]. "ppl" is the mean over seeds of each
    seed's perplexity exp(mean window NLL), "per_seed" those perplexities; the interval resamples
    documents once per resample and applies the draw to every seed at once."""
    nll = _nll_rows(window_nll)
    if nll.shape[1] != len(documents):
        raise ValueError(f"{nll.shape[1]} windows but {len(documents)} window documents")
    per_seed = np.exp(nll.mean(1))
    lo, hi = _interval(_seed_mean_ppl(nll, _resamples(documents, n, seed)), level)
    return {"ppl": float(per_seed.mean()), "lo": lo, "hi": hi, "per_seed": per_seed.tolist()}


def seed_mean_difference(window_nll_a, window_nll_b, documents, n: int = 2000, seed: int = 0,
                         level: float = 0.95) -> dict:
    """{"diff", "lo", "hi"}: the seed-mean perplexity of a ([seeds_a, windows]) minus that of b
    ([seeds_b, windows]) on the same windows, with a paired bootstrap interval over documents (one
    draw of documents for both and for every seed of each). The seed counts may differ."""
    a, b = _nll_rows(window_nll_a), _nll_rows(window_nll_b)
    if a.shape[1] != b.shape[1] or a.shape[1] != len(documents):
        raise ValueError(f"paired windows must match: {a.shape[1]} vs {b.shape[1]} windows, "
                         f"{len(documents)} window documents")
    w = _resamples(documents, n, seed)
    lo, hi = _interval(_seed_mean_ppl(a, w) - _seed_mean_ppl(b, w), level)
    return {"diff": float(np.exp(a.mean(1)).mean() - np.exp(b.mean(1)).mean()), "lo": lo, "hi": hi}
