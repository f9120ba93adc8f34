"""A left-padded batch decodes every prompt as it decodes alone, for every method, with the eager
step (LM.decode) and the static one (LM.static_step, what a CUDA graph captures); the static step
traces into one graph that does not recompile from token to token; a RoPE scale that follows the
length does not depend on the cache's size (float64)."""

import pytest
import torch

from helpers import V, assert_close, model_for
from lenx.attention import all_methods
from lenx.config import ConfigError
from lenx.model.decoding import StaticDecoder
from lenx.model.generate import batch_prompts, generate

STEPS = 5


def greedy(model, prompt_idx, cache, step, lengths=None):
    """Greedy decoding of STEPS tokens -> (tokens [B, STEPS], logits [B, STEPS + 1, vocab])."""
    with torch.no_grad():
        logits = [model.prefill(prompt_idx, cache, lengths)]
        tokens = []
        for _ in range(STEPS):
            tokens.append(logits[-1].argmax(-1))
            logits.append(step(tokens[-1]))
    return torch.stack(tokens, 1), torch.stack(logits, 1)


def alone(model, prompt):
    cache = model.new_cache(1, len(prompt) + STEPS)
    return greedy(model, prompt[None], cache, lambda t: model.decode(t[:, None], cache)[:, -1])


def batched(model, prompts, mode):
    idx, lengths = batch_prompts(prompts, width=model.halo)
    cache = model.new_cache(len(prompts), idx.shape[1] + STEPS)
    if mode == "eager":
        return greedy(model, idx, cache, lambda t: model.decode(t[:, None], cache)[:, -1], lengths)
    holder = {}

    def step(token):  # the decoder is built on the prefilled cache, at the first step
        holder.setdefault("decoder", StaticDecoder(model, cache, "static"))
        return holder["decoder"](token)

    return greedy(model, idx, cache, step, lengths)


def check_batch_against_alone(model, prompts, what):
    singles = [alone(model, p) for p in prompts]
    for mode in ("eager", "static"):
        tokens, logits = batched(model, prompts, mode)
        for b, (tok, lg) in enumerate(singles):
            assert torch.equal(tokens[b], tok[0]), f"{what} {mode}: prompt {b}'s tokens"
            assert_close(logits[b], lg[0], 1e-9, f"{what} {mode}: prompt {b}'s logits")


@pytest.mark.parametrize("method", all_methods())
def test_a_padded_batch_decodes_each_prompt_as_alone(method):
    """Positions per sequence (RoPE angles, the biases' distances, FIRE's normaliser, CoPE's gates),
    the padding never attended (DAPE's convolution reads it as its zero padding, stick-breaking's
    remainder breaks nothing there), in the eager step and in the fixed-shape one."""
    model = model_for(method)
    prompts = [torch.randint(0, V, (n,)) for n in (5, 11, 2)]
    check_batch_against_alone(model, prompts, method)


@pytest.mark.parametrize("method,overrides", [
    ("dapev2-kerple", {"dape_kernel": 5}),  # a halo of 2 rows, wider than the 1-token prompt
    ("dapev2-stickbreaking-fire", {"dape_kernel": 5, "sb_remainder": "head"}),
    ("rope", {"rope_scaling": "dynamic-ntk", "rope_train_len": 4}),  # the scale follows each sequence's length
    ("dapev2-rope", {"rope_scaling": "yarn", "rope_train_len": 4}),
    ("stickbreaking", {"sb_attend_current": True}),
])
def test_padded_batches_of_other_settings(method, overrides):
    model = model_for(method, **overrides)
    prompts = [torch.randint(0, V, (n,)) for n in (1, 9, 4)]
    check_batch_against_alone(model, prompts, f"{method} {overrides}")


def test_generate_takes_lists_and_padded_tensors():
    model = model_for("dapev2-kerple")
    prompts = [torch.randint(0, V, (n,)) for n in (3, 8)]
    want = [generate(model, p[None], 6, temperature=0)["tokens"][0] for p in prompts]
    idx, lengths = batch_prompts(prompts)
    for decoding in ("eager", "static"):
        from_list = generate(model, prompts, 6, temperature=0, decoding=decoding)
        from_tensor = generate(model, idx, 6, lengths=lengths, temperature=0, decoding=decoding)
        for out in (from_list, from_tensor):
            assert [torch.equal(out["tokens"][b], want[b]) for b in range(2)] == [True, True], decoding
            assert out["lengths"] == [6, 6] and out["prompt_tokens"] == 11 and out["decode_steps"] == 5


def test_stops_end_each_sequence_and_pad_it():
    model = model_for("kerple")
    prompts = [torch.randint(0, V, (n,)) for n in (4, 7, 2)]
    free = generate(model, prompts, 8, temperature=0)["tokens"]
    first = int(free[0, 2])  # sequence 0 stops at its third token (or earlier, if that token came before)
    out = generate(model, prompts, 8, temperature=0, stop_ids=[first], pad_id=V)
    for b in range(3):
        row = free[b].tolist()
        n = row.index(first) + 1 if first in row else 8
        assert out["lengths"][b] == n and out["stopped"][b] == (first in row)
        assert out["tokens"][b, :n].tolist() == row[:n]
        assert (out["tokens"][b, n:] == V).all()
    # a condition on the ids so far (a stop string) ends sequence 1 after two tokens; the others go on
    out = generate(model, prompts, 8, temperature=0, stop_if=lambda b, ids: b == 1 and len(ids) == 2)
    assert out["lengths"] == [8, 2, 8] and out["stopped"] == [False, True, False]
    # when every sequence has stopped, generation ends
    out = generate(model, prompts, 8, temperature=0, stop_if=lambda b, ids: True)
    assert out["tokens"].shape == (3, 1) and out["decode_steps"] == 0 and out["tokens_per_s"] is None


@pytest.mark.parametrize("method,overrides", [
    ("rope", {"rope_scaling": "dynamic-ntk", "rope_train_len": 4}), ("dapev2-kerple", {}),
    ("stickbreaking-t5", {"sb_remainder": "head"}), ("cope", {}), ("xl", {}), ("dape-fire", {}),
])
def test_the_static_step_traces_once(method, overrides):
    """torch.compile(fullgraph=True) traces the whole step (no graph break: no host sync, no branch on
    data) and does not recompile from token to token; its tokens are the eager step's."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    model = model_for(method, **overrides)
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


@pytest.mark.parametrize("scaling", ["dynamic-ntk", "yarn", "pi", "ntk"])
def test_an_auto_rope_scale_does_not_depend_on_max_new_tokens(scaling):
    """The scale follows each sequence's length (the prompt's for the first token), not the cache's
    capacity: the continuation is the same whatever --max-new-tokens, and its first token is the
    full forward's over the prompt."""
    model = model_for("rope", rope_scaling=scaling, rope_train_len=8)
    prompt = torch.randint(0, V, (2, 12))  # longer than the training length: a scale above 1
    short = generate(model, prompt, 3, temperature=0)["tokens"]
    long = generate(model, prompt, 30, temperature=0)["tokens"]
    assert torch.equal(short, long[:, :3])
    with torch.no_grad():
        assert torch.equal(short[:, 0], model(prompt)[0][:, -1].argmax(-1))
    plain = model_for("rope")  # within the training length a scaled RoPE is the identity
    inside = torch.randint(0, V, (1, 3))
    assert torch.equal(generate(model, inside, 5, temperature=0)["tokens"],
                       generate(plain, inside, 5, temperature=0)["tokens"])


def test_bad_batches_and_static_settings():
    model = model_for("dapev2-kerple", dape_kernel=5)
    with pytest.raises(ConfigError, match="lengths"):
        batch_prompts(torch.zeros(2, 4, dtype=torch.long), [4, 5])
    with pytest.raises(ConfigError, match="non-empty"):
        batch_prompts([torch.zeros(3, dtype=torch.long), torch.zeros(0, dtype=torch.long)])
    with pytest.raises(ConfigError, match="decoding"):
        generate(model, torch.zeros(1, 2, dtype=torch.long), 2, decoding="fast")
    cache = model.new_cache(1, 4)
    with torch.no_grad():
        model.prefill(torch.zeros(1, 1, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="left-pad"):
        StaticDecoder(model, cache)
    with pytest.raises(ValueError, match="CUDA"):
        StaticDecoder(model, cache, "graph")
    cache = model.new_cache(1, 3)
    with torch.no_grad():
        model.prefill(torch.zeros(1, 2, dtype=torch.long), cache)
        decoder = StaticDecoder(model, cache)
        decoder(torch.zeros(1, dtype=torch.long))
        with pytest.raises(ValueError, match="do not fit"):
            decoder(torch.zeros(1, dtype=torch.long))
