"""Confidence intervals for evaluation results: a bootstrap over documents, and over seeds and
documents for method differences (method_difference), with per-document diagnostics.

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


def _seed_mean(nll: np.ndarray, w: np.ndarray, scale: str = "ppl") -> np.ndarray:
    """For each resample (row of the window weights w, [n, windows]), the mean over seeds of each
    seed's perplexity (or, scale="nll", mean window value) on the resampled windows: [n]."""
    return _per_seed(nll, w, scale).mean(1)


def seed_mean_interval(window_nll, documents, n: int = 2000, seed: int = 0, level: float = 0.95,
                       scale: str = "ppl") -> dict:
    """{"ppl", "lo", "hi", "per_seed"} of runs that differ only in their training seed, measured
    on the same windows: window_nll is [seeds, windows]. "ppl" is the mean over seeds of each
    seed's perplexity exp(mean window NLL), "per_seed" those perplexities; the interval resamples
    documents once per resample and applies the draw to every seed at once. scale="nll": the same of
    the mean window value itself (e.g. bits per byte), under "mean" instead of "ppl"."""
    nll = _nll_rows(window_nll)
    if nll.shape[1] != len(documents):
        raise ValueError(f"{nll.shape[1]} windows but {len(documents)} window documents")
    per_seed = _per_seed(nll, np.ones((1, nll.shape[1])), scale)[0]
    lo, hi = _interval(_seed_mean(nll, _resamples(documents, n, seed), scale), level)
    return {"ppl" if scale == "ppl" else "mean": float(per_seed.mean()), "lo": lo, "hi": hi,
            "per_seed": per_seed.tolist()}


def seed_mean_difference(window_nll_a, window_nll_b, documents, n: int = 2000, seed: int = 0,
                         level: float = 0.95, scale: str = "ppl") -> dict:
    """{"diff", "lo", "hi"}: the seed-mean perplexity (scale="nll": mean window value) of a
    ([seeds_a, windows]) minus that of b ([seeds_b, windows]) on the same windows, with a paired
    bootstrap interval over documents (one draw of documents for both and for every seed of each).
    The seed counts may differ."""
    a, b = _nll_rows(window_nll_a), _nll_rows(window_nll_b)
    if a.shape[1] != b.shape[1] or a.shape[1] != len(documents):
        raise ValueError(f"paired windows must match: {a.shape[1]} vs {b.shape[1]} windows, "
                         f"{len(documents)} window documents")
    w, ones = _resamples(documents, n, seed), np.ones((1, a.shape[1]))
    lo, hi = _interval(_seed_mean(a, w, scale) - _seed_mean(b, w, scale), level)
    return {"diff": float(_seed_mean(a, ones, scale)[0] - _seed_mean(b, ones, scale)[0]), "lo": lo, "hi": hi}


# --- methods over seeds and documents ---------------------------------------------------------------

def _per_seed(nll: np.ndarray, w: np.ndarray, scale: str) -> np.ndarray:
    """Each seed's statistic under window weights w ([n, windows]): [n, seeds]; mean NLL ("nll") or
    its exponential, the perplexity ("ppl")."""
    mean = (w @ nll.T) / w.sum(1, keepdims=True)
    return np.exp(mean) if scale == "ppl" else mean


def method_difference(window_nll_a, window_nll_b, documents, n: int = 2000, seed: int = 0, level: float = 0.95,
                      scale: str = "ppl") -> dict:
    """Method a minus method b, each measured over its training seeds ([seeds, windows] window NLLs)
    on the same windows, with an interval for both sources of variation: the documents (shared by the
    two methods: paired) and the seeds (each method's own).

    The estimate is the difference of the seed means of each seed's statistic (perplexity
    exp(mean window NLL), or the mean NLL itself with scale="nll"). Its variance is the sum of
    - the documents' part: the variance of that difference over paired bootstrap resamples of the
      documents (every seed of both methods reweighted by the same draw), and
    - each method's seeds' part: the sample variance of its per-seed values over its seed count,
    and the interval is Student's t with Welch-Satterthwaite degrees of freedom (documents - 1, and
    seeds - 1 per method). A two-level percentile bootstrap (seeds resampled within each method) was
    tried first: with 2-3 seeds it covered a simulated truth only 85-92 % of the time at 95 %
    (three clusters cannot show their own spread); this covers 95-96 % (tests/test_stats.py).

    Returns diff, lo, hi; seed_sd_a / seed_sd_b (the spread of the per-seed values; None with one
    seed); var_documents, var_seeds, dof; covers: "seeds and documents", or "documents only" when a
    method has one seed (its seed-to-seed spread is unknown, so the interval is too narrow for a claim
    about the method)."""
    import scipy.stats

    a, b = _nll_rows(window_nll_a), _nll_rows(window_nll_b)
    if a.shape[1] != b.shape[1] or a.shape[1] != len(documents):
        raise ValueError(f"paired windows must match: {a.shape[1]} vs {b.shape[1]} windows, "
                         f"{len(documents)} window documents")
    if scale not in ("ppl", "nll"):
        raise ValueError(f"scale must be 'ppl' or 'nll', got {scale!r}")
    ones = np.ones((1, a.shape[1]))
    pa, pb = _per_seed(a, ones, scale)[0], _per_seed(b, ones, scale)[0]
    diff = float(pa.mean() - pb.mean())
    w = _resamples(documents, n, seed)
    boot = _per_seed(a, w, scale).mean(1) - _per_seed(b, w, scale).mean(1)
    parts = [(float(boot.var(ddof=1)), len(np.unique(documents)) - 1)]
    for p in (pa, pb):
        if len(p) > 1:
            parts.append((float(p.var(ddof=1)) / len(p), len(p) - 1))
    var = sum(v for v, _ in parts)
    if var == 0:
        lo = hi = diff
        dof = float("inf")
    else:
        dof = var ** 2 / sum(v ** 2 / max(k, 1) for v, k in parts)
        half = float(scipy.stats.t.ppf((1 + level) / 2, dof)) * var ** 0.5
        lo, hi = diff - half, diff + half
    return {"diff": diff, "lo": lo, "hi": hi,
            "seed_sd_a": float(pa.std(ddof=1)) if len(pa) > 1 else None,
            "seed_sd_b": float(pb.std(ddof=1)) if len(pb) > 1 else None,
            "var_documents": parts[0][0], "var_seeds": var - parts[0][0], "dof": dof,
            "covers": "seeds and documents" if len(pa) > 1 and len(pb) > 1 else "documents only"}


def document_shares(window_nll_a, window_nll_b, documents) -> list[dict]:
    """Each document's share of the difference in mean NLL (a minus b, seed means, window by window):
    its windows' summed difference over the window count, largest magnitude first. The shares sum to
    the whole difference."""
    a, b = _nll_rows(window_nll_a), _nll_rows(window_nll_b)
    d = a.mean(0) - b.mean(0)
    documents = np.asarray(documents)
    rows = [{"document": doc.item() if hasattr(doc, "item") else doc, "share": float(d[documents == doc].sum() / len(d)),
             "windows": int((documents == doc).sum())} for doc in np.unique(documents)]
    return sorted(rows, key=lambda r: -abs(r["share"]))


def leave_one_document_out(window_nll_a, window_nll_b, documents, n: int = 2000, seed: int = 0,
                           level: float = 0.95, scale: str = "ppl") -> dict:
    """Whether the verdict of method_difference (a better, b better, or neither: the interval holds 0)
    survives dropping any one document. Returns the verdict on all documents and the documents whose
    removal changes it, each with the difference and interval without it."""
    documents = np.asarray(documents)
    a, b = _nll_rows(window_nll_a), _nll_rows(window_nll_b)

    def verdict(r):
        return "a lower" if r["hi"] < 0 else "b lower" if r["lo"] > 0 else "no difference"

    whole = method_difference(a, b, documents, n, seed, level, scale)
    flips = []
    for doc in np.unique(documents):
        keep = documents != doc
        if not keep.any():
            continue
        r = method_difference(a[:, keep], b[:, keep], documents[keep], n, seed, level, scale)
        if verdict(r) != verdict(whole):
            flips.append({"document": doc.item() if hasattr(doc, "item") else doc, "verdict": verdict(r),
                          "diff": r["diff"], "lo": r["lo"], "hi": r["hi"]})
    return {"verdict": verdict(whole), "flips": flips}


def window_summary(window_nll, documents, vocab_size: int | None = None) -> dict:
    """Per-method figures beside exp(mean NLL): the median window NLL (over seeds' windows), and with a
    vocabulary size the windows whose mean NLL is above ln(vocabulary), the loss of guessing
    uniformly (text the model cannot read: a table of numbers, say), and their documents."""
    nll = _nll_rows(window_nll)
    out = {"median_nll": float(np.median(nll)), "ppl": float(np.exp(nll.mean(1)).mean())}
    if vocab_size:
        above = (nll > np.log(vocab_size)).any(0)
        out["above_uniform_windows"] = int(above.sum())
        out["above_uniform_documents"] = sorted({d.item() if hasattr(d, "item") else d
                                                 for d in np.asarray(documents)[above]})
    return out


def document_win_rate(window_nll_a, window_nll_b, documents) -> float:
    """The share of documents on which a's mean NLL (seed means, over the document's windows) is
    lower than b's; ties count half."""
    a, b = _nll_rows(window_nll_a).mean(0), _nll_rows(window_nll_b).mean(0)
    documents = np.asarray(documents)
    wins = [np.sign(b[documents == doc].mean() - a[documents == doc].mean()) for doc in np.unique(documents)]
    return float(np.mean([(w + 1) / 2 for w in wins]))
