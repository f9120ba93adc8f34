"""Document-masked packing (train.documents=masked): a packed window's logits are its documents' logits
run one by one, forward and backward, for every kind of position part."""

import pytest
import torch

from helpers import V, model_for

# documents of length 1, one that ends mid-chunk (chunk 16) and a last one cut by the window's end
LENGTHS = [1, 20, 1, 5, 13]
METHODS = ["rope", "kerple", "alibi", "t5", "fire", "xl", "dapev2-kerple", "dape-kerple", "stickbreaking", "cope",
           "fox", "pope", "nope", "ssmax-rope", "logn-alibi", "dapev2-stickbreaking-alibi"]
# FIRE's normaliser reads the query's position only past L_init; logn's past its training length
OVERRIDES = {"fire_L_init": 4.0, "temp_train_len": 8}


def packed(lengths, seed=3):
    torch.manual_seed(seed)
    idx = torch.randint(0, V, (1, sum(lengths)))
    doc_ids = torch.tensor([sum(([d] * n for d, n in enumerate(lengths)), [])])
    return idx, doc_ids


def alone_and_packed(model, lengths):
    """(the logits of the packed window [T, V], those of each document run alone, concatenated)."""
    idx, doc_ids = packed(lengths)
    together = model(idx, doc_ids=doc_ids)[0][0]
    pieces, at = [], 0
    for n in lengths:
        pieces.append(model(idx[:, at:at + n])[0][0])
        at += n
    return together, torch.cat(pieces)


def grads(model, logits, weight):
    model.zero_grad()
    (logits * weight).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("backend", ["dense", "chunked"])
@pytest.mark.parametrize("method", METHODS)
def test_a_packed_window_is_its_documents_run_alone(method, backend):
    model = model_for(method, backend=backend, **OVERRIDES)
    together, alone = alone_and_packed(model, LENGTHS)
    assert torch.allclose(together, alone, rtol=0, atol=1e-10), (together - alone).abs().max()
    weight = torch.randn_like(alone)
    g_together, g_alone = grads(model, together, weight), grads(model, alone, weight)
    assert g_together.keys() == g_alone.keys()
    for name in g_alone:
        assert torch.allclose(g_together[name], g_alone[name], rtol=0, atol=1e-9), name


@pytest.mark.parametrize("method", ["rope", "fire", "dapev2-kerple", "ssmax-rope"])
def test_without_positions_restarting_the_window_differs(method):
    """The check above has teeth: the same window with one document id for all differs from the
    documents run alone."""
    model = model_for(method, backend="chunked", **OVERRIDES)
    idx, _ = packed(LENGTHS)
    with torch.no_grad():
        _, alone = alone_and_packed(model, LENGTHS)
        one = model(idx, doc_ids=torch.zeros_like(idx))[0][0]
    assert not torch.allclose(one[1:], alone[1:], rtol=0, atol=1e-6)


def test_fox_key_value_shift_restarts_at_each_document():
    model = model_for("fox", backend="chunked", fox_kv_shift=True, fox_output_gate=True, fox_qk_norm=True)
    with torch.no_grad():
        together, alone = alone_and_packed(model, LENGTHS)
    assert torch.allclose(together, alone, rtol=0, atol=1e-10)


def test_default_backend_plans_with_the_documents():
    """On the CPU the planner's own choice (sdpa with a mask for nope, chunked for kerple) gives the
    documents alone too."""
    for method in ("nope", "kerple"):
        model = model_for(method)
        with torch.no_grad():
            together, alone = alone_and_packed(model, LENGTHS)
        assert torch.allclose(together, alone, rtol=0, atol=1e-10), method


def test_a_masked_run_plans_and_records_the_backends_that_take_document_ids():
    """The fused kernels take the document ids, DAPE V2's (its O(T)-memory kernel) and Kerple's: a
    masked run's meta.json (backends, backend_notes) and its memory estimate name them, no note."""
    from dataclasses import replace

    from lenx.model.memory import estimate_memory

    cuda = torch.device("cuda")
    model = model_for("dapev2-kerple", d_model=32, dape_hidden=4)
    assert model.backend_notes(cuda) == []
    assert model.backend_notes(cuda, segments=True) == []
    assert model.backends(cuda, segments=True) == ["triton", "triton"]
    cfg = replace(model.cfg, backend="auto")
    assert estimate_memory(cfg, 2, 64, cuda, segments=True).backend == "triton"
    assert estimate_memory(cfg, 2, 64, cuda).backend != "chunked"
    kerple = model_for("kerple", d_model=32)
    assert kerple.backend_notes(cuda, segments=True) == []
    assert kerple.backends(cuda, segments=True) == ["triton", "triton"]


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["kerple", "rope", "dapev2-kerple", "stickbreaking", "fox"])
def test_a_packed_window_is_its_documents_run_alone_on_cuda(method):
    """On the device the planner's backends with document ids (the fused kernels for kerple and
    stick-breaking, sdpa, chunked) against the documents run alone there, fp32."""
    from lenx.config import LMConfig
    from lenx.model import LM

    torch.manual_seed(0)
    model = LM(LMConfig(method=method, vocab_size=V, n_layer=2, n_head=2, d_model=64, dape_hidden=4)).cuda().eval()
    idx, doc_ids = packed([1, 70, 1, 33, 150])
    with torch.no_grad():
        for p in model.parameters():  # away from the initial values, so that context changes the logits
            p.add_(0.2 * torch.randn_like(p))
        together = model(idx.cuda(), doc_ids=doc_ids.cuda())[0][0]
        crossing = model(idx.cuda())[0][0]
        alone, at = [], 0
        for n in [1, 70, 1, 33, 150]:
            alone.append(model(idx[:, at:at + n].cuda())[0][0])
            at += n
    alone = torch.cat(alone)
    tol = 1e-3 * alone.abs().max().item()  # fp32, different kernels alone and packed
    assert (together - alone).abs().max().item() < tol, method
    assert (crossing - alone).abs().max().item() > 10 * tol, method  # without the mask it would fail
