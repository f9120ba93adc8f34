"""Splitting a corpus by document into train, val and test, stratified by length and seeded;
`long_test` reserves long documents for test first."""

from __future__ import annotations

import numpy as np

from ..errors import DataError
from ..layout import SPLITS

LONG_TEST_TOKENS = 16384  # the default size of a document that `long_test` reserves for test
# Built-in corpora whose test split holds long documents unless asked otherwise: (documents, tokens).
# 16385 tokens: an evaluation window of 16384 tokens plus the target of its last one.
LONG_TEST_DEFAULTS = {"code": (300, 16385)}


def long_test_default(name: str) -> tuple[int, int]:
    """(long_test, long_test_tokens) of corpus `name` when `lenx prepare` is not given them: the
    `code` corpus reserves 300 documents of >= 16385 tokens for test (reserve_long_docs draws them,
    by the seed, from all documents that long); every other corpus none, as it always did."""
    return LONG_TEST_DEFAULTS.get(name, (0, LONG_TEST_TOKENS))


def split_docs(lengths: np.ndarray, seed: int, val_frac: float, test_frac: float) -> np.ndarray:
    """Assign each document to 0=train, 1=val, 2=test; whole documents only.

    Stratified by length so val and test get their fair share of long documents:
    docs are sorted longest first (shuffled within blocks of 20 neighbours), then
    dealt out with running quotas, so every stretch of the length ranking
    contributes about val_frac/test_frac of its docs.
    """
    rng = np.random.default_rng(seed)
    n = len(lengths)
    order = np.lexsort((rng.random(n), -np.asarray(lengths)))
    for i in range(0, n, 20):
        rng.shuffle(order[i : i + 20])
    split = np.zeros(n, dtype=np.int8)
    phase = rng.random(2)  # where in each quota period the pick lands
    counts = [0, 0]
    for rank, doc in enumerate(order):
        for s, frac in ((1, val_frac), (2, test_frac)):
            if counts[s - 1] < np.floor((rank + 1) * frac + phase[s - 1]):
                split[doc] = s
                counts[s - 1] += 1
                break
    # Tiny corpora: train and each requested split still get one document, taken from the
    # biggest split, if there are enough documents.
    wanted = [0] + [s for s, frac in ((1, val_frac), (2, test_frac)) if frac > 0]
    for s in wanted:
        sizes = np.bincount(split, minlength=3)
        donor = int(np.argmax(sizes))
        if sizes[s] == 0 and sizes[donor] > 1:
            split[rng.choice(np.flatnonzero(split == donor))] = s
    return split


def split_docs_reserving(lengths: np.ndarray, reserved: np.ndarray, seed: int, val_frac: float,
                         test_frac: float) -> np.ndarray:
    """split_docs of the documents not in `reserved`; the reserved ones all go to test (2).

    With nothing reserved this is split_docs itself, so the split is the one it always was.
    """
    if len(reserved) == 0:
        return split_docs(lengths, seed, val_frac, test_frac)
    lengths = np.asarray(lengths)
    rest = np.setdiff1d(np.arange(len(lengths)), reserved)
    split = np.full(len(lengths), 2, dtype=np.int8)
    split[rest] = split_docs(lengths[rest], seed, val_frac, test_frac)
    return split


def reserve_long_docs(name: str, token_counts: np.ndarray, n: int, min_tokens: int, seed: int,
                      counted_with: str) -> np.ndarray:
    """The indices (sorted) of `n` documents of at least `min_tokens` tokens, drawn by `seed`
    from all such documents; a one-line DataError when there are fewer than `n`."""
    candidates = np.flatnonzero(np.asarray(token_counts) >= min_tokens)
    if len(candidates) < n:
        raise too_few_long(name, n, min_tokens, f"has only {len(candidates)} ({counted_with})")
    rng = np.random.default_rng([seed, 0x6C6F6E67])  # a stream of its own: the other draws stay as they were
    return np.sort(rng.choice(candidates, size=n, replace=False))


def too_few_long(name: str, n: int, min_tokens: int, have: str) -> DataError:
    return DataError(f"--long-test {n} needs {n} documents of >= {min_tokens} tokens, but corpus {name!r} {have}; "
                     "ask for fewer (--long-test), or a lower --long-test-tokens")


def _check_enough_docs(name: str, n_docs: int, val_frac: float, test_frac: float, long_test: int = 0) -> None:
    """Splitting by document needs one document for train and for each requested split (test
    has its reserved documents when `long_test`), besides the `long_test` reserved ones."""
    splits = ["train"] + [s for s, frac in (("val", val_frac), ("test", test_frac))
                          if frac > 0 and not (s == "test" and long_test)]
    if n_docs < len(splits) + long_test:
        which = splits[0] if len(splits) == 1 else ", ".join(splits[:-1]) + " and " + splits[-1]
        also = f", besides the {long_test} reserved for test by --long-test" if long_test else ""
        raise DataError(f"corpus {name!r} has {n_docs} document{'' if n_docs == 1 else 's'} after cleaning, "
                        f"but splitting by document needs at least {len(splits) + long_test} (one each for "
                        f"{which}{also}); add documents")


def check_docs(name: str, n_docs: int, n_long_bytes: int | None, val_frac: float, test_frac: float,
               long_test: int, long_test_tokens: int) -> None:
    """What can be checked before any tokenizing: enough documents (`n_docs`) for the splits, and, as
    a token of a byte-level tokenizer is at least one byte, enough documents of `long_test_tokens`
    bytes (`n_long_bytes` of them; None for another tokenizer)."""
    _check_enough_docs(name, n_docs, val_frac, test_frac, long_test)
    if long_test and n_long_bytes is not None and n_long_bytes < long_test:
        big = n_long_bytes
        raise too_few_long(name, long_test, long_test_tokens,
                           f"has at most {big} (only {big} of its documents have >= {long_test_tokens} "
                           "bytes, and a token is at least one byte)")


def split_members(assign: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """Each split's documents in a seeded random order, which mixes the split's stream."""
    rng = np.random.default_rng(seed + 1)
    return {s: rng.permutation(np.flatnonzero(assign == i)) for i, s in enumerate(SPLITS)}


def drop_from_splits(members: dict[str, np.ndarray], drop: np.ndarray, val_frac: float,
                     test_frac: float) -> dict[str, np.ndarray]:
    """split_members' splits without the documents `drop`, every other document where it was; a
    requested split that loses all its documents takes the last document of the biggest split (as
    split_docs does for tiny corpora), when that one has more than one."""
    if len(drop) == 0:
        return members
    out = {s: m[~np.isin(m, drop)] for s, m in members.items()}
    for s, frac in zip(SPLITS, (1, val_frac, test_frac), strict=True):
        donor = max(SPLITS, key=lambda x: len(out[x]))
        if frac > 0 and len(out[s]) == 0 and len(out[donor]) > 1:
            out[s], out[donor] = out[donor][-1:], out[donor][:-1]
    return out
