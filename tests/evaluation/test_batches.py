import pytest
import torch

from lenx.evaluation.batches import halving_batches


def test_out_of_memory_halves_the_batch_and_retries_the_same_slice():
    tried = []

    def read(start, stop):
        tried.append((start, stop))
        if stop - start > 2:
            raise torch.OutOfMemoryError("fake")
        return list(range(start, stop))

    got = list(halving_batches(7, 8, read))
    assert tried[:3] == [(0, 7), (0, 4), (0, 2)]
    assert [(a, b) for a, b, _ in got] == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert sum((part for _, _, part in got), []) == list(range(7))


def test_one_item_that_does_not_fit_raises():
    def read(start, stop):
        raise torch.OutOfMemoryError("fake")

    with pytest.raises(torch.OutOfMemoryError):
        list(halving_batches(3, 4, read))
