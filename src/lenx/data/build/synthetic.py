"""The `synthetic` corpus: token-level text with local structure and long-range repeats.

Tokens 0..254 come from a random order-2 Markov chain (the next token's candidates
depend on the previous token, their weights on the previous two), so a model learns
short-range statistics first. On top, each document repeats spans copied from earlier
in the same document, at distances up to the document's length, so a model that uses
long context predicts those spans almost perfectly. Token 255 is EOS.

Everything derives from the seed; generation is vectorised over many parallel
chains, so ~2.5M tokens take about a second.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..layout import SPLITS
from .writer import write_split

VOCAB = 256
EOS = 255
N_SYMBOLS = 255  # tokens 0..254
CANDIDATES = 8  # next-token choices per context: low entropy, learnable
STREAMS = 128  # chains generated side by side

TRAIN_TOKENS = 2_000_000
TRAIN_LEN = (32, 32768)  # log-uniform document lengths
EVAL_LEN = (2048, 32768)  # val/test documents are drawn long, for extrapolation tests
MIN_TEST_DOCS, MIN_VAL_DOCS = 32, 16
COPY_EVERY = 200  # on average one copied span per this many tokens
COPY_SPAN = (8, 64)
MIN_COPY_DISTANCE = 64


def _log_uniform(rng, lo: int, hi: int, n: int) -> np.ndarray:
    return np.exp(rng.uniform(np.log(lo), np.log(hi), n)).astype(np.int64)


def _doc_lengths(rng, val_frac: float, test_frac: float, train_tokens: int) -> dict[str, np.ndarray]:
    # Draw train lengths until the train split holds `train_tokens`.
    lens = np.empty(0, dtype=np.int64)
    while lens.sum() < train_tokens:
        lens = np.concatenate([lens, _log_uniform(rng, *TRAIN_LEN, 256)])
    train = lens[: int(np.searchsorted(np.cumsum(lens), train_tokens)) + 1]
    # val/test doc counts follow the fractions (of all docs), with floors so long-context
    # evaluation always has material.
    n_all = len(train) / max(1e-9, 1 - val_frac - test_frac)
    n_val = max(MIN_VAL_DOCS, round(val_frac * n_all)) if val_frac > 0 else 0
    n_test = max(MIN_TEST_DOCS, round(test_frac * n_all)) if test_frac > 0 else 0
    return {"train": train, "val": _log_uniform(rng, *EVAL_LEN, n_val), "test": _log_uniform(rng, *EVAL_LEN, n_test)}


def _markov_stream(rng, n_tokens: int) -> np.ndarray:
    """n_tokens from the order-2 chain, as STREAMS independent chains laid end to end."""
    cand = np.stack([rng.choice(N_SYMBOLS, CANDIDATES, replace=False) for _ in range(N_SYMBOLS)])
    weights = rng.dirichlet(np.full(CANDIDATES, 0.5), size=N_SYMBOLS * N_SYMBOLS)
    cdf = np.cumsum(weights, axis=1)
    cdf[:, -1] = 1.0
    steps = -(-n_tokens // STREAMS)
    x = np.empty((STREAMS, steps), dtype=np.int64)
    x[:, :2] = rng.integers(0, N_SYMBOLS, (STREAMS, 2))
    u = rng.random((steps, STREAMS))
    for t in range(2, steps):
        a, b = x[:, t - 2], x[:, t - 1]
        j = (u[t][:, None] > cdf[a * N_SYMBOLS + b]).sum(axis=1)
        x[:, t] = cand[b, np.minimum(j, CANDIDATES - 1)]
    return x.reshape(-1)[:n_tokens]


def _add_copies(rng, doc: np.ndarray) -> None:
    """Overwrite random spans with copies of earlier spans, in place, left to right."""
    n = len(doc)
    for _ in range(n // COPY_EVERY):
        span = int(rng.integers(*COPY_SPAN))
        if n - span <= MIN_COPY_DISTANCE + span:
            return
        dst = int(rng.integers(MIN_COPY_DISTANCE + span, n - span))
        # Log-uniform distance: many near copies, and some from the very start.
        dist = int(np.exp(rng.uniform(np.log(MIN_COPY_DISTANCE), np.log(dst))))
        src = dst - max(dist, span)
        doc[dst : dst + span] = doc[src : src + span]


def generate(seed: int = 0, val_frac: float = 0.02, test_frac: float = 0.05,
             train_tokens: int = TRAIN_TOKENS) -> dict[str, list[np.ndarray]]:
    """Documents (uint16 arrays, no EOS) per split; identical for identical arguments."""
    rng_len, rng_chain, rng_copy = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    lengths = _doc_lengths(rng_len, val_frac, test_frac, train_tokens)
    total = sum(int(v.sum()) for v in lengths.values())
    stream = _markov_stream(rng_chain, total).astype(np.uint16)
    out, pos = {}, 0
    for split in ("train", "val", "test"):
        docs = []
        for n in lengths[split]:
            doc = stream[pos : pos + n].copy()
            pos += n
            _add_copies(rng_copy, doc)
            docs.append(doc)
        out[split] = docs
    return out


def describe() -> dict:
    """How the corpus was made, for the manifest."""
    return {
        "name": "synthetic",
        "generator": "order-2 Markov chain over 255 symbols + long-range span copies",
        "candidates_per_context": CANDIDATES,
        "train_doc_len": list(TRAIN_LEN),
        "eval_doc_len": list(EVAL_LEN),
        "copy_every_tokens": COPY_EVERY,
        "copy_span": list(COPY_SPAN),
    }


def build_synthetic(folder: Path, seed: int, val_frac: float, test_frac: float) -> dict:
    """Write the corpus's splits into `folder`; return the manifest's "sources", "missing_sources",
    "tokenizer" and "splits" entries."""
    docs = generate(seed, val_frac, test_frac)
    splits = {}
    for split in SPLITS:
        splits[split] = write_split(folder, split, iter(docs[split]), EOS)
        splits[split]["chars"] = None
    return {"sources": [describe()], "missing_sources": [],
            "tokenizer": {"kind": "none", "vocab_size": VOCAB, "eos_id": EOS, "eos_token": None},
            "splits": splits}
