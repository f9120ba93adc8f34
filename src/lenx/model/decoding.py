"""Decoding with fixed shapes, and its CUDA graph (`lenx generate --cuda-graph`, `lenx bench --decode`).

LM.decode (the eager step) reads the keys up to the current length, so every token has new shapes,
and launches each of a step's hundreds of small kernels from Python: at batch 1 decoding is
launch-bound. LM.static_step reads all the cache's slots with the empty ones masked, takes the slot
as a tensor and never waits for the host, so one CUDA graph replays a whole step ("graph"), or
torch.compile compiles it once for every token ("compile"). "static" runs the same step without
either (on any device: it is what the graph records). A compiled step is kept per model and shape
(_compiled), so a second generate() of the same shape does not compile again.

Under bf16 autocast the step runs on a copy of the model whose Linear and Conv2d weights are already
bf16: autocast would round them to bf16 at every call (a cast kernel and a pass over the weights
each), and rounding once gives the same bits.
"""

from contextlib import nullcontext
import copy
import types
import weakref

import torch
from torch import nn

MODES = ("eager", "static", "graph", "compile")
# model -> {what a compiled step is specialised to: (its bf16 twin or None, the compiled step)}; an
# entry lives as long as its model. torch.compile's guards still check every call, so a kept step
# that no longer matches (weights moved, another dtype) compiles again rather than running wrong.
_COMPILED: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


def _own_code(fn):
    """A copy of function fn with a code object of its own. torch.compile keeps what it compiles, and
    counts recompiles against its limit (8), per code object: a step compiled from one shared
    function would recompile for every decoder (another model, cache or batch), and fullgraph makes
    the ninth decoder of a process an error."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _bf16_matmul_weights(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of model whose Linear and Conv2d parameters are `dtype` (the output head untied from the
    embedding, which keeps its precision), for a step run under autocast to `dtype`."""
    twin = copy.deepcopy(model)
    for module in twin.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)) and module is not twin.lm_head:
            module.to(dtype)
    twin.lm_head.weight = nn.Parameter(model.wte.weight.detach().to(dtype), requires_grad=False)
    return twin.eval()


def _step(model, token, cache, pos, dtype):
    """One static step of `model` under autocast to `dtype` (None: none): what "compile" compiles."""
    autocast = torch.autocast(pos.device.type, dtype=dtype, cache_enabled=False) if dtype is not None else nullcontext()
    with autocast:
        return model.static_step(token, cache, pos)


def _compiled(model, cache, dtype, options: dict):
    """The step model, compiled step for `model` decoding `cache`'s shapes under autocast to `dtype`:
    made (and its bf16 twin copied) at the first call, kept for the next ones, whose twin then gets
    the model's current weights (it must not decode with stale ones)."""
    key = (cache.batch, cache.capacity, cache.tokens.device, cache.layers[0].k.dtype, dtype,
           tuple(sorted((k, repr(v)) for k, v in options.items())))
    kept = _COMPILED.setdefault(model, {})
    if key not in kept:
        twin = None if dtype is None else _bf16_matmul_weights(model, dtype)
        kept[key] = twin, torch.compile(_own_code(_step), **options)
    else:
        twin = kept[key][0]
        if twin is not None:
            with torch.no_grad():
                mine = twin.state_dict()
                for name, value in model.state_dict().items():
                    mine[name].copy_(value)
    twin, step = kept[key]
    return (model if twin is None else twin), step


def static_inputs(cache, pos: torch.Tensor, token: torch.Tensor) -> list[torch.Tensor]:
    """What a compiled step reads in place: its position and token, the cache's tokens and starts, and
    everything each layer keeps per slot (keys, values, MTA's queries, FoX's extras)."""
    return [pos, token, cache.tokens, cache.start] + [t for l in cache.layers for t, _ in l.slot_tensors()]


class StaticDecoder:
    """Appends one token per sequence to a prefilled cache per call: decoder(token [B]) -> the next
    logits [B, vocab], the same as model.decode(token[:, None], cache)[:, -1].

    mode: "static" (LM.static_step as it is), "graph" (captured once into a CUDA graph and replayed;
    CUDA only) or "compile" (torch.compile(fullgraph=True), "reduce-overhead" on CUDA, so that the
    compiled step is a CUDA graph too; compile_options replace those settings). autocast_dtype: the
    autocast the step runs under (bf16 on CUDA, as LM.decode's caller has it), None for none.
    With "graph" and "compile" the returned logits live in a buffer that the next call overwrites.
    The cache must hold at least model.halo slots (pad narrower prompts to that width)."""

    def __init__(self, model, cache, mode: str = "static", autocast_dtype: torch.dtype | None = None,
                 compile_options: dict | None = None):
        if mode not in MODES[1:]:
            raise ValueError(f"StaticDecoder mode must be one of {', '.join(MODES[1:])}, got {mode!r}")
        device = cache.tokens.device
        if mode == "graph" and device.type != "cuda":
            raise ValueError("a CUDA graph needs a CUDA device (on a CPU: mode 'static' or 'compile')")
        if cache.length < model.halo:
            raise ValueError(f"the static step recomputes the {model.halo} rows before the new token: the prompts "
                             f"must fill at least {model.halo} slots (left-pad them), not {cache.length}")
        self.cache, self.mode, self.dtype = cache, mode, autocast_dtype
        self.pos = torch.tensor(cache.length, device=device)  # the slot of the next token
        self.token = torch.zeros(cache.batch, dtype=torch.long, device=device)
        self.graph, self.logits, self._compiled = None, None, _step
        if mode == "compile":
            if device.type == "cuda":
                # the cache and the step's inputs keep their addresses: the compiled CUDA graph reads them in place
                for t in static_inputs(cache, self.pos, self.token):
                    torch._dynamo.mark_static_address(t)
            options = {"fullgraph": True, "dynamic": False}
            options |= {"mode": "reduce-overhead"} if device.type == "cuda" else {}
            self.model, self._compiled = _compiled(model, cache, autocast_dtype, options | (compile_options or {}))
        else:
            self.model = model if autocast_dtype is None else _bf16_matmul_weights(model, autocast_dtype)
        if mode == "graph":
            self._capture()

    @torch.no_grad()
    def _run(self) -> torch.Tensor:
        return self._compiled(self.model, self.token, self.cache, self.pos, self.dtype)

    def _capture(self) -> None:
        # Warm-up on a side stream (lazy initialisation of cuBLAS and the allocator must not happen
        # during the capture). It writes only slot pos and the halo rows before it, which the first
        # real step writes again before anything reads them.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._run()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._run()

    @torch.no_grad()
    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        if self.cache.length >= self.cache.capacity:
            raise ValueError(f"the cache holds {self.cache.capacity} tokens; {self.cache.length + 1} do not fit")
        self.token.copy_(token)
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits
        else:
            logits = self._run()
        self.pos += 1
        self.cache.length += 1
        return logits
