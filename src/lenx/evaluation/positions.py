"""Per-position loss (`lenx eval --per-position`, eval.per_position): the mean NLL at each token
position of the longest evaluation windows, in log-spaced bins (the FoX paper's per-position figure).

It costs no forward pass of its own. `lenx eval` reads every window at the longest length and keeps
the NLL of all its targets (evaluate.py: the scored tokens are its last ones), so position p is that
forward's target p: the token predicted after reading the window's tokens 0..p (0-based; a model
trained at T saw positions 0..T-1). The shorter lengths' windows are suffixes of these, read from
later starts, so they add no position. `lenx eval --hf` bins the model's own tokens the same way, up
to the shortest window's count of them (all of them when its tokenizer is the corpus's).

Bins are half-open [edges[k], edges[k+1]): 0, 1, 2, 3, then floor(2^(i/4)) (four a doubling), the
last the longest length; powers of two are edges, so a power-of-two training length parts the
positions seen in training from those beyond. eval.json keeps each bin's mean over windows and each
window's mean over the bin ("window_nll", [bins][windows]): one value per window, which `lenx
compare` and `lenx plot` resample by document and pool over seeds for the intervals, as they do
the perplexity's (lenx.report.stats).
"""

import math

import numpy as np

PER_OCTAVE = 4
POSITIONS = ("0-based index of the last token read: bin k holds the targets predicted after reading tokens "
             "0..p of a window, edges[k] <= p < edges[k+1]")


def log_edges(longest: int, per_octave: int = PER_OCTAVE) -> list[int]:
    """Bin edges over positions 0..longest-1: 0, then floor(2^(i/per_octave)) below `longest`, then longest."""
    if longest < 1:
        raise ValueError(f"per-position bins need at least one position, got {longest}")
    edges, i = {0}, 0
    while (edge := math.floor(2 ** (i / per_octave) + 1e-9)) < longest:
        edges.add(edge)
        i += 1
    return sorted(edges) + [longest]


def bin_means(nll, edges: list[int]) -> np.ndarray:
    """Each window's mean NLL over the positions of each bin: [bins, windows] float64, from the NLL at
    every position [windows, edges[-1]]."""
    nll = np.asarray(nll, dtype=np.float64)
    if nll.ndim != 2 or nll.shape[1] != edges[-1]:
        raise ValueError(f"NLL per position must be [windows, {edges[-1]}], got shape {nll.shape}")
    sums = np.add.reduceat(nll, edges[:-1], axis=1)
    return (sums / np.diff(edges)).T


def per_position(nll, unit: str = "corpus tokens") -> dict:
    """The "per_position" entry of eval.json from the NLL at every position of the longest windows
    ([windows, positions], any float type): edges, each bin's mean over windows, each window's means."""
    nll = np.asarray(nll, dtype=np.float64)
    edges = log_edges(nll.shape[1])
    rows = bin_means(nll, edges)
    return {"positions": POSITIONS, "unit": unit, "from_length": int(nll.shape[1]), "per_octave": PER_OCTAVE,
            "edges": edges, "nll": [float(r.mean()) for r in rows],
            "window_nll": [[round(float(x), 6) for x in r] for r in rows]}


def model_token_rows(rows: list[np.ndarray]) -> np.ndarray:
    """The NLL of each window's model tokens ([window] 1-D arrays) cut to the shortest: [windows, shortest]."""
    shortest = min(len(r) for r in rows)
    return np.stack([np.asarray(r[:shortest], dtype=np.float64) for r in rows])
