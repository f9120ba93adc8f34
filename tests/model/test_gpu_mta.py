"""MTA on a GPU: the decode step captured in a CUDA graph (which reads the cached queries of the rows
before the new one without a host sync) gives the eager step's tokens for a padded batch, and the
chunked path under bf16 autocast stays near its fp32 run, forward and backward; each with and
without the post-softmax convolution; a windowed MTA's graph step and a packed batch on the GPU."""

import pytest
import torch

from helpers import V, model_for
from lenx.model.generate import generate


def prompts(lengths=(7, 30, 2)):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, V, (n,), generator=g).cuda() for n in lengths]


@pytest.mark.gpu
@pytest.mark.parametrize("method,post", [("mta", False), ("mta-kerple", False), ("mta-kerple", True)])
def test_the_cuda_graph_gives_the_eager_tokens(method, post):
    model = model_for(method, mta_head_mix="both", mta_post_conv=post).float().cuda()
    eager = generate(model, prompts(), 24, temperature=0, decoding="eager")["tokens"]
    graph = generate(model, prompts(), 24, temperature=0, decoding="graph")["tokens"]
    assert torch.equal(graph, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("post", [False, True])
def test_chunked_bf16_is_near_fp32(post):
    model = model_for("mta-kerple", mta_head_mix="both", mta_post_conv=post, chunk_size=16).float().cuda()
    idx = torch.randint(0, V, (2, 111), device="cuda")
    ref_logits, _ = model(idx)
    ref_logits.float().square().mean().backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits, _ = model(idx)
    logits.float().square().mean().backward()
    err = (logits.float() - ref_logits).abs().max() / ref_logits.abs().max()
    assert err < 0.05, err
    for p, g in zip(model.parameters(), ref):  # bf16 moves Kerple's r1 by ~15% on a CPU (cosine 0.99)
        assert torch.isfinite(p.grad).all()
        assert (p.grad - g).norm() <= 0.3 * g.norm() + 1e-6
        assert torch.nn.functional.cosine_similarity(p.grad.flatten(), g.flatten(), 0) > 0.95


@pytest.mark.gpu
def test_a_windowed_and_packed_mta_on_the_gpu():
    """A window: the CUDA graph's step (its ring read without a host sync) gives the eager tokens.
    Document ids: the packed fp32 forward on the GPU is near the float64 one on the CPU."""
    import copy

    cpu = model_for("mta-kerple", window=6, mta_head_mix="both", mta_post_conv=True, chunk_size=16)
    model = copy.deepcopy(cpu).float().cuda()
    eager = generate(model, prompts(), 24, temperature=0, decoding="eager")["tokens"]
    graph = generate(model, prompts(), 24, temperature=0, decoding="graph")["tokens"]
    assert torch.equal(graph, eager)
    idx = torch.randint(0, V, (2, 63), generator=torch.Generator().manual_seed(2))
    docs = torch.tensor([sum(([d] * n for d, n in enumerate(row)), []) for row in ([1, 20, 3, 1, 38], [40, 23])])
    with torch.no_grad():
        want = cpu(idx, doc_ids=docs)[0]
        got = model(idx.cuda(), doc_ids=docs.cuda())[0].double().cpu()
    err = (got - want).abs().max() / want.abs().max()
    assert err < 5e-3, err  # fp32 against float64 (1e-6 on a CPU); cuDNN may run the convs in TF32
