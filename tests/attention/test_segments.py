"""Document segments (a document id per token; no row attends across a boundary) on every backend that
takes them, against the hand-built float64 reference of test_window, and through the LM."""

import pytest
import torch

from helpers import V, model_for
from lenx.attention.masks import document_ids
from test_window import METHODS, compare


def segments_of(lengths_per_row):
    return torch.tensor([sum(([d] * n for d, n in enumerate(lengths)), []) for lengths in lengths_per_row])


# documents of length 1 among longer ones, a document that ends mid-chunk (chunk 16)
SEGMENTS = {63: segments_of([[1, 20, 1, 1, 40], [63]]), 111: segments_of([[50, 1, 60], [7] * 15 + [6]])}
ONE = segments_of([[1], [1]])


@pytest.mark.parametrize("T", [1, 63, 111])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_segments_on_the_reference_paths(backend, method, T):
    compare(backend, method, T, 0, ONE if T == 1 else SEGMENTS[T])


@pytest.mark.parametrize("method", ["kerple", "dapev2-kerple", "stickbreaking", "fox", "dapev2-fox",
                                    "stickbreaking-fox", "mta-kerple"])
@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_segments_with_a_window(backend, method):
    compare(backend, method, 111, 13, SEGMENTS[111])


@pytest.mark.parametrize("T", [1, 63])
def test_segments_on_sdpa(T):
    compare("sdpa", "nope", T, 0, ONE if T == 1 else SEGMENTS[T])
    compare("sdpa", "nope", T, 5, ONE if T == 1 else SEGMENTS[T])


@pytest.mark.parametrize("method", ["nope", "kerple"])
def test_segments_on_flex(method):
    pytest.importorskip("torch.nn.attention.flex_attention")
    compare("flex", method, 63, 0, SEGMENTS[63])
    compare("flex", method, 63, 7, SEGMENTS[63])


def test_document_ids_of_a_packed_batch():
    eos = 0
    tokens = torch.tensor([[5, 6, 0, 7, 0, 0, 8], [0, 1, 2, 3, 4, 5, 6]])
    assert document_ids(tokens, eos).tolist() == [[0, 0, 0, 1, 1, 2, 3], [0, 1, 1, 1, 1, 1, 1]]


@pytest.mark.parametrize("method", ["rope", "alibi", "dapev2-kerple", "stickbreaking", "cope", "mta"])
def test_no_token_sees_another_document(method):
    """Through the LM: changing the first document's tokens leaves the second's logits as they were, and
    without doc_ids they would change."""
    model = model_for(method)
    idx = torch.randint(1, V, (1, 30))
    docs = segments_of([[12, 18]])
    other = idx.clone()
    other[:, :12] = torch.randint(1, V, (1, 12))
    with torch.no_grad():
        a, b = model(idx, doc_ids=docs)[0], model(other, doc_ids=docs)[0]
        plain = model(other)[0]
    assert torch.allclose(a[:, 12:], b[:, 12:], rtol=0, atol=1e-12)
    assert not torch.allclose(a[:, 12:], plain[:, 12:], rtol=0, atol=1e-6)


def test_bad_segments_are_refused_before_any_work():
    model = model_for("rope")
    idx = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"shape \[2, 8\]"):
        model(idx, doc_ids=torch.zeros(2, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        model(idx, doc_ids=torch.zeros(2, 8))
