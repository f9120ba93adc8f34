"""On a GPU: the decode step captured in a CUDA graph (and compiled with torch.compile's
reduce-overhead) gives the eager step's tokens, for a padded batch."""

import pytest
import torch

from helpers import V, model_for
from lenx.model.decoding import StaticDecoder
from lenx.model.generate import batch_prompts, generate

GRAPH_METHODS = ["rope", "kerple", "dapev2-kerple", "stickbreaking", "cope", "fire", "xl", "t5",
                 "dapev2-stickbreaking-alibi"]


def cuda_model(method, **overrides):
    return model_for(method, **overrides).float().cuda()


def prompts(lengths=(7, 30, 2)):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, V, (n,), generator=g).cuda() for n in lengths]


@pytest.mark.gpu
@pytest.mark.parametrize("method", GRAPH_METHODS)
def test_the_cuda_graph_gives_the_eager_tokens_fp32(method):
    model = cuda_model(method)
    eager = generate(model, prompts(), 24, temperature=0, decoding="eager")["tokens"]
    graph = generate(model, prompts(), 24, temperature=0, decoding="graph")["tokens"]
    assert torch.equal(graph, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["rope", "kerple", "dapev2-kerple", "stickbreaking"])
def test_the_cuda_graph_under_bf16_autocast(method):
    """Under autocast the graph runs a copy with bf16 matmul weights: the same bits as autocast's own
    casts, so captured or not its tokens are the same; its first logits are the eager step's."""
    model = cuda_model(method)

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16)

    static = generate(model, prompts(), 24, temperature=0, decoding="static", autocast=autocast)["tokens"]
    graph = generate(model, prompts(), 24, temperature=0, decoding="graph", autocast=autocast)["tokens"]
    assert torch.equal(graph, static)
    idx, lengths = batch_prompts(prompts(), width=model.halo)
    caches = [model.new_cache(3, idx.shape[1] + 4, dtype=torch.bfloat16) for _ in range(2)]
    with torch.no_grad(), autocast():
        token = model.prefill(idx, caches[0], lengths).argmax(-1)
        model.prefill(idx, caches[1], lengths)
        eager = model.decode(token[:, None], caches[0])[:, -1].float()
    captured = StaticDecoder(model, caches[1], "graph", torch.bfloat16)(token).float()
    assert (captured - eager).abs().max() <= 0.05 * eager.abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("overrides", [{"rope_scaling": "dynamic-ntk", "rope_train_len": 8},
                                       {"dape_kernel": 5}])
def test_the_cuda_graph_with_a_length_following_scale_and_a_wide_halo(overrides):
    model = cuda_model("dapev2-rope", **overrides)
    eager = generate(model, prompts((1, 20, 9)), 16, temperature=0, decoding="eager")["tokens"]
    assert torch.equal(generate(model, prompts((1, 20, 9)), 16, temperature=0, decoding="graph")["tokens"], eager)


@pytest.mark.gpu
def test_the_compiled_step_gives_the_eager_tokens():
    model = cuda_model("kerple")
    eager = generate(model, prompts(), 12, temperature=0, decoding="eager")["tokens"]
    assert torch.equal(generate(model, prompts(), 12, temperature=0, decoding="compile")["tokens"], eager)


@pytest.mark.gpu
def test_the_eager_step_runs_no_cudnn_attention():
    """cuDNN's SDPA plans anew for each shape: the eager step (one key more every token) must not
    pick it (it made an 8192-token RoPE step 50 ms instead of ~8 on an H100)."""
    model = model_for("rope").cuda()
    idx = torch.randint(0, V, (1, 40), device="cuda")
    cache = model.new_cache(1, 48)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        model.prefill(idx[:, :32], cache)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for i in range(32, 36):
                model.decode(idx[:, i:i + 1], cache)
            torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert names and not [n for n in names if "cudnn" in n.lower()], names
