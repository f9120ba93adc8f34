"""Multi-query associative recall (MQAR), in the style of Zoology (Arora et al. 2023).

One sequence, for `N = n_pairs`, `Q = n_queries`::

    k_1 v_1 k_2 v_2 ... k_N v_N   q_1 a_1 q_2 a_2 ... q_Q a_Q
    \\_______ context ________/   \\________ queries _______/

* keys come from ids `[0, vocab_size // 2)` and are distinct within a
  sequence (so every key has one value); values come from
  `[vocab_size // 2, vocab_size)`, independently uniform (may repeat).
  The two ranges are disjoint, so a model cannot confuse a key with a value.
* the queries `q_i` are Q distinct keys of the context in random order, and
  `a_i` is the value paired with `q_i`.
* `targets` has the same shape as `inputs` and is already aligned for a causal
  LM: `targets[:, t]` is what the model should predict after reading
  `inputs[:, :t+1]`.  It equals `a_i` at each query position `q_i` and -100
  everywhere else, so `F.cross_entropy(logits.flatten(0, 1),
  targets.flatten(), ignore_index=-100)` scores exactly the recalls; do NOT
  shift again.  (Equivalently, it is next-token prediction on the sequence
  restricted to the answer tokens; `a_i` also appears in `inputs`, as in
  Zoology, which is harmless for a causal model.)

T = 2 * (n_pairs + n_queries).  Chance for one recall is `2 / vocab_size`
(a uniform guess among the values).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["IGNORE_INDEX", "sample_recall"]

IGNORE_INDEX = -100


def sample_recall(
    batch: int,
    n_pairs: int,
    n_queries: int,
    vocab_size: int,
    rng: np.random.Generator,
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Samples MQAR sequences; returns `(inputs [B, T], targets [B, T])`.

    See the module docstring for the layout.  Requires `1 <= n_queries <=
    n_pairs <= vocab_size // 2`.  All randomness comes from `rng`.
    """
    if batch < 1 or n_pairs < 1 or n_queries < 1:
        raise ValueError(f"batch, n_pairs and n_queries must be >= 1, got {batch}, {n_pairs}, {n_queries}")
    if n_queries > n_pairs:
        raise ValueError(f"n_queries ({n_queries}) cannot exceed n_pairs ({n_pairs}): queries are distinct keys")
    n_keys = vocab_size // 2
    if n_pairs > n_keys:
        raise ValueError(
            f"vocab_size={vocab_size} gives {n_keys} key ids, too few for {n_pairs} distinct keys; "
            f"use vocab_size >= {2 * n_pairs}"
        )

    # Distinct keys per row: the first n_pairs of a random permutation.
    keys = rng.permuted(np.tile(np.arange(n_keys), (batch, 1)), axis=1)[:, :n_pairs]
    values = rng.integers(n_keys, vocab_size, size=(batch, n_pairs))
    # Which pairs are queried, and in which order.
    order = rng.permuted(np.tile(np.arange(n_pairs), (batch, 1)), axis=1)[:, :n_queries]
    query_keys = np.take_along_axis(keys, order, axis=1)
    answers = np.take_along_axis(values, order, axis=1)

    context_len = 2 * n_pairs
    total = context_len + 2 * n_queries
    inputs = np.empty((batch, total), dtype=np.int64)
    inputs[:, 0:context_len:2] = keys
    inputs[:, 1:context_len:2] = values
    inputs[:, context_len::2] = query_keys
    inputs[:, context_len + 1 :: 2] = answers

    targets = np.full((batch, total), IGNORE_INDEX, dtype=np.int64)
    targets[:, context_len::2] = answers  # predicted while reading the query key
    return torch.from_numpy(inputs), torch.from_numpy(targets)
