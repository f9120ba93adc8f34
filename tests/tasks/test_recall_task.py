"""Tests for the multi-query associative recall sampler (lenx.tasks.recall)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lenx.tasks import IGNORE_INDEX, sample_recall


def test_shapes_and_layout():
    inputs, targets = sample_recall(8, n_pairs=16, n_queries=5, vocab_size=64, rng=np.random.default_rng(0))
    assert inputs.shape == targets.shape == (8, 2 * (16 + 5))
    assert inputs.dtype == targets.dtype == torch.long
    context = inputs[:, : 2 * 16]
    assert (context[:, 0::2] < 32).all()  # keys
    assert (context[:, 1::2] >= 32).all() and (context[:, 1::2] < 64).all()  # values
    # Only query positions are scored.
    scored = targets != IGNORE_INDEX
    assert not scored[:, : 2 * 16].any()
    assert scored[:, 2 * 16 :: 2].all() and not scored[:, 2 * 16 + 1 :: 2].any()


def test_targets_are_the_recalled_values():
    n_pairs, n_queries = 10, 7
    inputs, targets = sample_recall(64, n_pairs, n_queries, 50, np.random.default_rng(1))
    for row_in, row_t in zip(inputs.tolist(), targets.tolist()):
        keys, values = row_in[0 : 2 * n_pairs : 2], row_in[1 : 2 * n_pairs : 2]
        assert len(set(keys)) == n_pairs  # distinct keys -> one value each
        lookup = dict(zip(keys, values))
        queries = row_in[2 * n_pairs :: 2]
        assert len(set(queries)) == n_queries
        for i, q in enumerate(queries):
            t = 2 * n_pairs + 2 * i
            assert row_t[t] == lookup[q]
            assert row_in[t + 1] == lookup[q]  # the answer token follows the query


def test_usable_with_causal_lm_cross_entropy():
    vocab = 40
    inputs, targets = sample_recall(4, 8, 8, vocab, np.random.default_rng(2))
    # An oracle that looks up the answer reaches zero loss on scored positions.
    logits = torch.full((*inputs.shape, vocab), -1e4)
    scored = targets != IGNORE_INDEX
    logits[scored, targets[scored]] = 1e4
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    uniform = F.cross_entropy(torch.zeros(*inputs.shape, vocab).flatten(0, 1), targets.flatten())
    assert uniform.item() == pytest.approx(np.log(vocab), rel=1e-5)


def test_determinism_and_errors():
    a = sample_recall(4, 6, 3, 32, np.random.default_rng(5))
    b = sample_recall(4, 6, 3, 32, np.random.default_rng(5))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="n_queries"):
        sample_recall(2, 4, 5, 32, np.random.default_rng(0))
    with pytest.raises(ValueError, match="vocab_size"):
        sample_recall(2, 20, 5, 32, np.random.default_rng(0))
    with pytest.raises(ValueError):
        sample_recall(0, 4, 2, 32, np.random.default_rng(0))
