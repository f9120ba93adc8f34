"""MTA under masks (a window, document ids): the tensor form against the loops with the masks applied
entry by entry, a packed batch against each document run alone (float64, dense and chunked with
blocks cut inside the query halo, forward and backward, and through the LM), and a windowed model's
decoding (its ring) against the full forward."""

from dataclasses import replace

import pytest
import torch

import lenx.model.lm as lm_module
from helpers import V, assert_close, assert_static_step_decodes, decode_steps_and_block, model_for
from mta_helpers import attention, qkv
from lenx.attention.backends import run_backend
from lenx.attention.cache import RingCache
from lenx.attention.masks import positions
from lenx.ops.mta.reference import mta_loops
from test_segments import segments_of

BOTH = dict(mta_head_mix="both", mta_post_conv=True, mta_post_query_kernel=3, mta_post_key_kernel=3)


def run(attn, q, k, v, backend="dense", chunk=16, segments=None, window=0):
    parts = replace(attn.parts, window=window, segments=segments is not None)
    if segments is not None and parts.bias is not None:  # positions restart in each document, as Attention does
        parts = replace(parts, bias=parts.bias.at(positions(segments)))
    out, rem = run_backend(backend, q, k, v, parts, chunk, segments)
    return attn.processor.finish(attn.normaliser.finish(out, rem, v))


@pytest.mark.parametrize("window,docs", [(3, None), (1, None), (0, [[4, 1, 6], [11]]), (4, [[2, 9], [5, 6]])])
def test_the_tensor_form_is_the_loops_under_masks(window, docs):
    """The loops apply the rule entry by entry: a masked entry reads as one past the causal edge, an
    output row reads no key (so no row) of another document."""
    attn = attention("mta-alibi", **BOTH)
    p = attn.processor
    T = 11
    q, k, v = qkv(T)
    segments = None if docs is None else segments_of(docs)
    pos = torch.arange(T)
    bias = attn.bias(pos, pos) if segments is None else attn.bias(positions(segments), positions(segments))
    norm = (p.norm_weight, p.gate.weight[0], p.gate.bias)
    want = mta_loops(q, k, v, p.conv_kernel, p.pre_mix, p.post_mix, bias, norm, p.post_conv_kernel, window, segments)
    for backend, chunk in (("dense", 16), ("chunked", 2), ("chunked", 5)):  # blocks inside the halo of 2 + 2
        got = run(attn, q, k, v, backend, chunk, segments, window)
        assert_close(got, want, 1e-10, f"{backend} {chunk} W={window} docs={docs}")


@pytest.mark.parametrize("method", ["mta", "mta-kerple"])
@pytest.mark.parametrize("window", [0, 5])
def test_a_packed_batch_is_each_document_alone(method, window):
    """Documents of 1, of fewer rows than the halo and ending mid-block: each document's rows (and the
    gradients through them) are those of it run alone, with 6 x 11 kernels before and after the softmax."""
    attn = attention(method, mta_query_kernel=6, mta_key_kernel=11, mta_head_mix="both", mta_post_conv=True)
    lengths = [[1, 20, 3, 1, 38], [63]]
    segments = segments_of(lengths)
    q, k, v = qkv(63)
    grad = torch.randn_like(q)
    for backend, chunk in (("dense", 16), ("chunked", 7), ("chunked", 16)):
        out = run(attn, q, k, v, backend, chunk, segments, window)
        got = torch.autograd.grad(out, (q, k, v), grad)
        for b, row in enumerate(lengths):
            start = 0
            for n in row:
                s = slice(start, start + n)
                alone = [t[b:b + 1, :, s].detach().requires_grad_() for t in (q, k, v)]
                ref = run(attn, *alone, backend, chunk, None, window)
                what = f"{method} {backend} {chunk} W={window} sequence {b} rows {start}..{start + n - 1}"
                assert_close(out[b:b + 1, :, s], ref, 1e-10, what)
                ref_grads = torch.autograd.grad(ref, alone, grad[b:b + 1, :, s])
                for g, r, name in zip(got, ref_grads, "qkv"):
                    assert_close(g[b:b + 1, :, s], r, 1e-9, f"{what} d{name}", floor=1e-12)
                start += n


def test_no_token_of_the_lm_sees_another_document():
    """Through the LM (mta_every=1: both layers convolve): changing the first document leaves the
    second's logits as they are, which are those of the second document alone."""
    model = model_for("mta-kerple", **BOTH)
    idx = torch.randint(1, V, (1, 30))
    docs = segments_of([[12, 18]])
    other = idx.clone()
    other[:, :12] = torch.randint(1, V, (1, 12))
    with torch.no_grad():
        a, b = model(idx, doc_ids=docs)[0], model(other, doc_ids=docs)[0]
        alone = model(idx[:, 12:])[0]
    assert torch.allclose(a[:, 12:], b[:, 12:], rtol=0, atol=1e-12)
    assert_close(a[:, 12:], alone, 1e-10, "the second document alone")


@pytest.fixture
def small_ring(monkeypatch):
    monkeypatch.setattr(lm_module, "RING_ROWS", 4)  # a ring far smaller than the context


@pytest.mark.parametrize("method", ["mta", "mta-kerple"])
def test_windowed_decoding_equals_the_full_forward(small_ring, method):
    """The ring keeps the window, the query halo's rows above a step and their queries: token by token,
    in blocks longer than a ring step and from a prompt longer than the ring, every step is the full
    forward's row, and the ring does not grow with the context."""
    W, T = 5, 40
    model = model_for(method, window=W, mta_query_kernel=3, mta_key_kernel=5, **BOTH)
    halo = model.blocks[0].attn.processor.q_halo
    assert halo == 4
    idx = torch.randint(0, V, (2, T))
    steps, cache, block = decode_steps_and_block(model, idx)
    with torch.no_grad():
        full = model(idx)[0]
    for i, logits in enumerate(steps):
        assert_close(logits, full[:, i], 1e-9, f"{method} step {i}")
    assert_close(block, full[:, 25:36], 1e-9, f"{method} a block of 11")
    ring = 4 + W - 1 + halo  # RING_ROWS = 4
    assert all(isinstance(layer, RingCache) and layer.k.shape[2] == ring and layer.q.shape[2] == ring
               for layer in cache.layers)
    assert model.new_cache(1, 4096).layers[0].q.shape[2] == ring


def test_windowed_static_step_with_a_padded_batch(small_ring):
    model = model_for("mta-alibi", window=4, mta_query_kernel=3, mta_key_kernel=3, **BOTH)
    assert_static_step_decodes(model, steps=8)
