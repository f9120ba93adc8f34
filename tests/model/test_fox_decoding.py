"""FoX decodes exactly (float64): the cache keeps the prefix sums c of its keys (and, under the
key/value shift, the layer input of each slot), so every step's logits are the full forward's, for
each Pro option and all of them, in a left-padded batch with the eager and the fixed-shape step, and
with a DAPE V2 halo whose rows are computed again. (tests/model/test_decode.py and
test_batched_decoding.py cover the fox compositions without options: they run every method.)"""

import pytest
import torch

from helpers import V, assert_close, model_for
from lenx.model.decoding import StaticDecoder
from lenx.model.generate import batch_prompts

PRO = ["fox_output_gate", "fox_qk_norm", "fox_kv_shift", "fox_output_norm"]
SETTINGS = [("fox", {s: True}) for s in PRO] + [
    ("fox", dict.fromkeys(PRO, True)),
    ("dapev2-fox", {"dape_kernel": 5, "fox_kv_shift": True}),  # a halo of 2 rows recomputed every step
    ("dapev2-stickbreaking-fox", dict.fromkeys(PRO, True)),
]


@pytest.mark.parametrize("method,switches", SETTINGS)
def test_decoding_equals_the_full_forward(method, switches):
    model = model_for(method, **switches)
    idx = torch.randint(0, V, (2, 23))
    with torch.no_grad():
        cache = model.new_cache(2, 23)
        steps = [model.prefill(idx[:, :4], cache)]
        steps += [model.decode(idx[:, i:i + 3], cache)[:, -1] for i in (4, 7)]  # blocks of three
        steps += [model.decode(idx[:, i:i + 1], cache)[:, 0] for i in range(10, 23)]
        ends = [4, 7, 10] + list(range(11, 24))
        for end, logits in zip(ends, steps):
            assert_close(logits, model(idx[:, :end])[0][:, -1], 1e-9, f"{method} {switches} after {end} tokens")


def last_logits(model, prompt, steps):
    """Greedy-free: feed the prompt then `steps` fixed tokens one by one; the logits of each."""
    cache = model.new_cache(1, len(prompt) + len(steps))
    out = [model.prefill(prompt[None], cache)]
    out += [model.decode(t.view(1, 1), cache)[:, -1] for t in steps]
    return torch.cat(out)


@pytest.mark.parametrize("method,switches", SETTINGS)
def test_a_padded_batch_decodes_each_prompt_as_alone(method, switches):
    """The padding's slots keep c = 0 and x = 0 (nothing forgotten, nothing shifted in), in the eager
    step and in the fixed-shape one (LM.static_step, what a CUDA graph captures)."""
    model = model_for(method, **switches)
    prompts = [torch.randint(0, V, (n,)) for n in (1, 9, 4)]
    follow = torch.randint(0, V, (3, 4))
    with torch.no_grad():
        singles = [last_logits(model, p, follow[b]) for b, p in enumerate(prompts)]
        for mode in ("eager", "static"):
            idx, lengths = batch_prompts(prompts, width=model.halo)
            cache = model.new_cache(3, idx.shape[1] + 4)
            got = [model.prefill(idx, cache, lengths)]
            decoder = StaticDecoder(model, cache, "static") if mode == "static" else None
            for t in follow.T:
                got.append(decoder(t) if decoder else model.decode(t[:, None], cache)[:, -1])
            got = torch.stack(got, 1)
            for b in range(3):
                assert_close(got[b], singles[b], 1e-9, f"{method} {switches} {mode}: prompt {b}")
                for layer in cache.layers:  # as the prefill left them, though a halo's rows ran over them
                    for kept in layer.extra.values():
                        assert not kept[b, :int(cache.start[b])].any(), f"{mode}: padding of prompt {b}"


def test_the_cache_keeps_the_prefix_sums():
    model = model_for("fox")
    idx = torch.randint(0, V, (1, 6))
    with torch.no_grad():
        cache = model.new_cache(1, 8)
        model.prefill(idx, cache)
        x = model.blocks[0].ln1(model.wte(idx))
        want = model.blocks[0].attn.bias.prefix_sums(x).transpose(1, 2)
    kept = cache.layers[0].extra["c"]
    assert_close(kept[:, :6], want, 1e-12, "c of the prompt")
    assert torch.equal(kept[:, 6:], torch.zeros_like(kept[:, 6:]))
    assert "x" not in cache.layers[0].extra  # only the key/value shift keeps the input


def test_the_static_step_traces_once():
    """The cache's extra tensors are read and written with no host sync and no branch on data: the
    fixed-shape step traces whole (fullgraph) into one graph, with the eager step's tokens."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from lenx.model.generate import generate

    model = model_for("fox", fox_kv_shift=True, fox_output_gate=True)
    prompts = [torch.randint(0, V, (n,)) for n in (6, 3)]
    want = generate(model, prompts, 8, temperature=0)["tokens"]
    torch._dynamo.reset()
    counters.clear()
    idx, lengths = batch_prompts(prompts, width=model.halo)
    cache = model.new_cache(2, idx.shape[1] + 8)
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        logits = model.prefill(idx, cache, lengths)
        decoder = StaticDecoder(model, cache, "compile", compile_options={"backend": "eager"})
        tokens = []
        for _ in range(8):
            tokens.append(logits.argmax(-1))
            logits = decoder(tokens[-1])
    assert torch.equal(torch.stack(tokens, 1), want)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
