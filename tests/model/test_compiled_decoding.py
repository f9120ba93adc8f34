"""The fixed-shape decode step compiled (StaticDecoder mode "compile": torch.compile with inductor,
on the CPU with gcc) gives the eager step's tokens; a process builds any number of compiled decoders
(torch.compile's recompile limit is per code object); and the step's operators, counted below
autograd, stay within what one step of a 2-layer model needed when the layers began sharing the
step's positions, masks, distances and RoPE table (scripts/tune/decode_ops.py, notes/decode_ops.md)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import V, model_for
from lenx.model.decoding import StaticDecoder
from lenx.model.generate import batch_prompts, generate


@pytest.mark.parametrize("method", ["rope", "kerple", "stickbreaking"])
def test_the_inductor_compiled_step_gives_the_eager_tokens(method):
    import torch._dynamo

    torch._dynamo.reset()
    model = model_for(method, n_layer=1).float()
    prompts = [torch.randint(0, V, (n,)) for n in (5, 2)]
    eager = generate(model, prompts, 6, temperature=0)
    compiled = generate(model, prompts, 6, temperature=0, decoding="compile")
    assert compiled["decoding"] == "compile" and compiled["decode_steps"] == 5
    assert torch.equal(compiled["tokens"], eager["tokens"])


def test_a_process_compiles_a_step_for_every_decoder():
    """Eleven decoders (another cache each) under fullgraph: each compiles its own step, where one
    shared step would hit the limit of 8 recompiles and fail."""
    import torch._dynamo

    model = model_for("kerple", n_layer=1)
    for n in range(11):
        cache = model.new_cache(1, 6 + n)
        with torch.no_grad():
            logits = model.prefill(torch.randint(0, V, (1, 3)), cache)
            token = logits.argmax(-1)
            want = model.decode(token[:, None], cache)[:, -1]
        cache.length = 3  # the same step again, compiled
        decoder = StaticDecoder(model, cache, "compile", compile_options={"backend": "eager"})
        torch.testing.assert_close(decoder(token), want, atol=1e-12, rtol=0)
    torch._dynamo.reset()


class Kernels(TorchDispatchMode):
    """The aten operators dispatched below autograd that are not views (about one kernel each on a GPU)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not (func.is_view or func._opname in ("view", "_unsafe_view", "alias")):
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def step_kernels(method: str, n_layer: int, bf16: bool) -> int:
    """Operators of one static step of a left-padded batch of two."""
    model = model_for(method, n_layer=n_layer).float()
    dtype = torch.bfloat16 if bf16 else None
    idx, lengths = batch_prompts([torch.randint(0, V, (n,)) for n in (6, 3)])
    cache = model.new_cache(2, 12, dtype=dtype)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        model.prefill(idx, cache, lengths)
    decoder = StaticDecoder(model, cache, "static", dtype)
    token = torch.zeros(2, dtype=torch.long)
    decoder(token)
    with Kernels() as seen:
        decoder(token)
    return len(seen.ops)


@pytest.mark.parametrize("method,fp32,bf16", [("rope", (47, 16), (52, 18)), ("kerple", (42, 19), (46, 22))])
def test_a_decode_step_s_operators_per_layer(method, fp32, bf16):
    """(one layer's whole step, each further layer): 45 and 49 per layer for RoPE (fp32, bf16
    autocast) and 36 and 39 for Kerple before the layers shared what depends on the rows only."""
    for precision, (whole, per_layer) in (("fp32", fp32), ("bf16", bf16)):
        one, two = (step_kernels(method, n, precision == "bf16") for n in (1, 2))
        assert one <= whole and two - one <= per_layer, (method, precision, one, two - one)


def test_a_second_generate_of_the_same_shape_does_not_compile_again():
    """generate(decoding="compile") keeps its compiled step per model and shape: the second call of
    the same shape compiles no graph (torch._dynamo's count of compiled graphs), gives the eager
    tokens, and sees weights changed in place between the calls; another shape compiles its own."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = model_for("kerple", n_layer=1).float()
    prompts = [torch.randint(0, V, (n,)) for n in (5, 2)]
    graphs = lambda: counters["stats"]["unique_graphs"]  # noqa: E731
    before = graphs()
    generate(model, prompts, 4, temperature=0, decoding="compile")
    first = graphs()
    assert first > before  # the first call compiled
    with torch.no_grad():  # weights changed in place: the kept step must read them, not a copy
        model.lm_head.weight.mul_(-1)
    again = generate(model, prompts, 4, temperature=0, decoding="compile")
    assert graphs() == first
    assert torch.equal(again["tokens"], generate(model, prompts, 4, temperature=0)["tokens"])
    generate(model, prompts, 7, temperature=0, decoding="compile")  # a longer cache: another shape
    assert graphs() > first
    torch._dynamo.reset()


@pytest.mark.parametrize("method", ["fox", "mta", "kerple"])
def test_the_compiled_step_keeps_every_cached_tensor_in_place(method):
    """On CUDA the compiled step's graph reads the cache in place, so every tensor a layer keeps per
    slot must be marked static: FoX's sums and shifted inputs and MTA's queries as well as k and v
    (a tensor left out would be copied into the graph at capture and go stale)."""
    from lenx.model.decoding import static_inputs

    model = model_for(method, n_layer=2)
    cache = model.new_cache(2, 8)
    pos, token = torch.tensor(0), torch.zeros(2, dtype=torch.long)
    marked = {id(t) for t in static_inputs(cache, pos, token)}
    for layer in cache.layers:
        kept = [layer.k, layer.v] + ([layer.q] if layer.q is not None else []) + list(layer.extra.values())
        assert all(id(t) in marked for t in kept), method
    if method == "fox":
        assert all(layer.extra for layer in cache.layers)
    if method == "mta":
        assert any(layer.q is not None for layer in cache.layers)
