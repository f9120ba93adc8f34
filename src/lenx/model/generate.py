"""Text generation from a trained run, token by token with a KV cache (`lenx generate`).

Each prompt is read with the usual forward (the planner's backends), then each new token costs one
row of attention per layer against the cache (LM.prefill / LM.decode). Prompts of different lengths
are decoded as one left-padded batch in which every sequence keeps its own positions, so greedy
decoding gives each the tokens it gets alone. Greedy decoding (temperature 0) is deterministic;
sampling is seeded. A sequence ends at a stop token or string (then pads while the others go on).
On CUDA the decode step can run as one CUDA graph (model.decoding.StaticDecoder).
"""

from contextlib import nullcontext
from pathlib import Path
import time

import torch

from ..attention.layouts import layer_configs
from ..config import ConfigError
from .decoding import MODES, StaticDecoder
from .lm import RING_ROWS

MAX_CONTEXT = 32768
GRAPH_ON_CUDA = True  # `lenx generate` decodes with a CUDA graph on CUDA unless --no-cuda-graph


def sample_next(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                generator: torch.Generator | None) -> torch.Tensor:
    """The next token [B] from logits [B, vocab]: argmax when temperature is 0, else a draw from
    softmax(logits / temperature) cut to the top_k most likely (0: all) and to the smallest set whose
    probability reaches top_p (1: all)."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens before it already reach top_p (the first always stays)
        drop = probs.cumsum(-1) - probs >= top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(logits.device)


def check_settings(max_new_tokens: int, temperature: float, top_k: int, top_p: float) -> None:
    if max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if temperature < 0:
        raise ConfigError(f"--temperature must be >= 0 (0 is greedy), got {temperature}")
    if top_k < 0:
        raise ConfigError(f"--top-k must be >= 0 (0 keeps every token), got {top_k}")
    if not 0 < top_p <= 1:
        raise ConfigError(f"--top-p must be in (0, 1], got {top_p}")


def _slot_bytes(method: str, m, item: int) -> int:
    """What one layer of `method` keeps per cache slot (LM.new_cache): keys and values, PoPE's keys
    twice as wide, MTA's queries (counted on every MTA layer: an upper bound, only its convolution
    layers keep them), FoX's prefix sums in fp32 and its input under the key/value shift."""
    parts = method.split("-")
    size = 2 * m.d_model * item
    if "pope" in parts:
        size += m.d_model * item
    if "mta" in parts:
        size += m.d_model * item
    if "fox" in parts:
        size += m.n_head * 4 + (m.d_model * item if m.fox_kv_shift else 0)
    return size


def check_generate_memory(cfg, batch: int, width: int, max_new_tokens: int, device: torch.device,
                          override: str = "--no-memory-check") -> None:
    """A one-line ConfigError, before the model is built, when decoding `batch` prompts of up to
    `width` tokens plus max_new_tokens new ones (cfg: a RunConfig) would not fit what `device` has
    available: the KV cache (what every layer keeps for every slot, and the tokens) beside
    what reading the prompts takes (lenx.model.memory's estimate of a forward with no gradient)."""
    from .memory import GB, available_memory, estimate_memory

    m = cfg.model
    reading = estimate_memory(m, batch, width, device, cfg.train.precision, training=False)
    item = 2 if cfg.train.precision == "bf16" or (cfg.train.precision == "auto" and device.type == "cuda") else 4
    slots = width + max_new_tokens
    # a windowed layer (model.window, or its layout entry's :wW) keeps a ring of slots (LM._ring_size;
    # bounded here by the widest DAPE halo)
    kept = sum((min(slots, c.window + RING_ROWS + 2 * (m.dape_kernel // 2)) if c.window else slots)
               * _slot_bytes(c.method, m, item) for c in layer_configs(m, m.layers, m.n_layer))
    cache = batch * (kept + slots * 8)
    have = available_memory(device)
    if have is not None and cache + reading.total > have:
        raise ConfigError(
            f"{batch} prompt{'s' if batch > 1 else ''} of up to {width:,} tokens and {max_new_tokens:,} new tokens "
            f"need about {(cache + reading.total) / GB:.1f} GB (the KV cache of {slots:,} slots "
            f"{cache / GB:.2f} GB, reading the prompts {reading.total / GB:.2f} GB) but {device} has "
            f"{have / GB:.1f} GB available; lower --max-new-tokens, or pass {override} if you know it fits")


def batch_prompts(prompts, lengths=None, device=None, width: int = 0) -> tuple[torch.Tensor, list[int]]:
    """A left-padded batch [B, T] and the prompts' lengths from `prompts`: a [B, T] tensor (each row
    a prompt of T tokens, or with `lengths`, prompt b the last lengths[b] of row b), or a list of
    prompts of any lengths (1-D tensors or lists of token ids). T is at least `width`."""
    if isinstance(prompts, torch.Tensor) and prompts.dim() == 2:
        B, T = prompts.shape
        lengths = [T] * B if lengths is None else [int(n) for n in lengths]
        if len(lengths) != B or not all(1 <= n <= T for n in lengths):
            raise ConfigError(f"lengths must be {B} numbers in 1..{T}, got {lengths}")
        rows = [prompts[b, T - n:] for b, n in enumerate(lengths)]
    else:
        if lengths is not None:
            raise ConfigError("lengths go with a padded [B, T] tensor of prompts, not with a list of prompts")
        rows = [torch.as_tensor(p, dtype=torch.long) for p in prompts]
        if not rows or any(r.dim() != 1 or len(r) == 0 for r in rows):
            raise ConfigError("prompts must be a [B, T] tensor or a non-empty list of non-empty 1-D prompts")
    lengths = [len(r) for r in rows]
    T = max(max(lengths), width)
    idx = torch.zeros(len(rows), T, dtype=torch.long, device=device or rows[0].device)
    for b, r in enumerate(rows):
        idx[b, T - len(r):] = r.to(idx.device)
    return idx, lengths


@torch.no_grad()
def generate(model, prompts, max_new_tokens: int, *, lengths=None, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, autocast=None, on_token=None, stop_ids=(), stop_if=None,
             pad_id: int = 0, decoding: str = "eager", progress=None, on_prefill=None) -> dict:
    """Continue each prompt by up to max_new_tokens tokens. prompts: a [B, T] tensor of token ids
    (on the model's device), left-padded when `lengths` [B] is given, or a list of prompts of any
    lengths (see batch_prompts). Each prompt is read alone (LM.prefill) and all are decoded as one
    batch, each sequence at its own positions.

    on_token(step, tokens [B]) is called after each step (streaming). A sequence ends after a token
    of stop_ids, or when stop_if(b, its new ids so far) says so (a stop string); from then on it gets
    pad_id, and generation ends when every sequence has ended. decoding: "eager" (LM.decode),
    "static", "graph" or "compile" (model.decoding.StaticDecoder). progress(done, total) hears the
    prefill's layers, on_prefill(prompt tokens, seconds) its end.

    Returns {"tokens": [B, n] new ids (pad_id after a sequence's end), "lengths": each sequence's
    new tokens (its stop token included), "stopped": whether each ended at a stop, "prompt_tokens",
    "prefill_s", "decode_s" (the decode steps, sampling included), "setup_s" (a graph's capture or a
    compilation), "decode_steps", "prefill_tokens_per_s" (prompt tokens, all prompts), "tokens_per_s"
    (decode steps per second: new tokens per second of each sequence), "batch_tokens_per_s" (that
    times B), "ms_per_token" (per step); the rates are None without a decode step}."""
    check_settings(max_new_tokens, temperature, top_k, top_p)
    if decoding not in MODES:
        raise ConfigError(f"decoding must be one of {', '.join(MODES)}, got {decoding!r}")
    autocast = autocast or nullcontext
    device = model.device
    # the static step recomputes the halo rows before the new token: give it that many slots
    idx, lengths = batch_prompts(prompts, lengths, device, model.halo if decoding != "eager" else 0)
    B, T = idx.shape
    generator = torch.Generator().manual_seed(seed)
    ctx = autocast()  # the cache holds what the layers compute: the autocast dtype, else the model's
    dtype = ctx.fast_dtype if isinstance(ctx, torch.autocast) and ctx._enabled else None
    cache = model.new_cache(B, T + max_new_tokens, device, dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    with autocast():
        logits = model.prefill(idx, cache, lengths, progress)
    sync()
    t1 = time.perf_counter()
    if on_prefill is not None:
        on_prefill(sum(lengths), t1 - t0)
    step_fn = lambda token: model.decode(token[:, None], cache)[:, -1]  # noqa: E731
    if decoding != "eager" and max_new_tokens > 1:
        decoder = StaticDecoder(model, cache, decoding, dtype)
        step_fn = decoder
    sync()
    t2 = time.perf_counter()
    stop_ids = {int(t) for t in stop_ids}
    check_stops = bool(stop_ids) or stop_if is not None
    ids: list[list[int]] = [[] for _ in range(B)]
    stopped = [False] * B
    done = None  # the ended sequences, on the device, once there is one
    new, steps = [], 0
    for step in range(max_new_tokens):
        sampled = sample_next(logits, temperature, top_k, top_p, generator)
        # an ended sequence shows pad_id; the model goes on reading what it sampled (pad_id need not be a token)
        token = sampled if done is None else sampled.masked_fill(done, pad_id)
        new.append(token)
        if on_token is not None:
            on_token(step, token)
        if check_stops:
            for b, t in enumerate(token.tolist()):
                if not stopped[b]:
                    ids[b].append(t)
                    stopped[b] = t in stop_ids or (stop_if is not None and bool(stop_if(b, ids[b])))
            if all(stopped):
                break
            if any(stopped):
                done = torch.tensor(stopped, device=device)
        if step + 1 < max_new_tokens:
            with autocast():
                logits = step_fn(sampled)
            steps += 1
    sync()
    t3 = time.perf_counter()
    decode_s = t3 - t2
    rate = (lambda n: n / decode_s) if steps and decode_s > 0 else (lambda n: None)
    return {"tokens": torch.stack(new, 1), "lengths": [len(i) for i in ids] if check_stops else [len(new)] * B,
            "stopped": stopped, "prompt_tokens": sum(lengths), "prefill_s": t1 - t0, "decode_s": decode_s,
            "setup_s": t2 - t1, "decode_steps": steps, "decoding": decoding,
            "prefill_tokens_per_s": sum(lengths) / max(t1 - t0, 1e-9), "tokens_per_s": rate(steps),
            "batch_tokens_per_s": rate(B * steps), "ms_per_token": 1000 * decode_s / steps if steps else None}


def encode_prompt(corpus, text: str) -> list[int]:
    """Token ids of a prompt: the corpus tokenizer's, or whitespace-separated ids for a token-level
    corpus (the synthetic one)."""
    if not text.strip():
        raise ConfigError("the prompt is empty")
    if corpus.tokenizer() is None:
        try:
            ids = [int(t) for t in text.split()]
        except ValueError:
            example = " ".join(str(i % corpus.vocab_size) for i in (12, 7, 43, 5))  # ids the corpus has
            raise ConfigError(f"corpus {corpus.name!r} is token-level: give the prompt as token ids 0.."
                              f"{corpus.vocab_size - 1} separated by spaces, e.g. --prompt '{example}'") from None
        bad = [i for i in ids if not 0 <= i < corpus.vocab_size]
        if bad:
            raise ConfigError(f"token ids {bad[:5]} are outside the vocabulary 0..{corpus.vocab_size - 1}")
        return ids
    return corpus.encode(text)


class Stops:
    """Where a continuation ends: after a token of `ids`, or at a stop string. On a text corpus a stop
    string is matched in the decoded text; on a token-level corpus it is token ids separated by spaces,
    matched as the last tokens."""

    def __init__(self, corpus, strings=(), ids=()):
        self.corpus, self.ids = corpus, {int(i) for i in ids}
        bad = [i for i in self.ids if not 0 <= i < corpus.vocab_size]
        if bad:
            raise ConfigError(f"--stop-id {bad[0]} is outside the vocabulary 0..{corpus.vocab_size - 1}")
        if any(not s for s in strings):
            raise ConfigError("--stop is empty: give the text (or token ids) that ends a continuation")
        self.token_level = corpus.tokenizer() is None
        self.strings = list(strings)
        self.sequences = [self._ids(s) for s in strings] if self.token_level else []
        # what streaming holds back: the end of the text that may yet turn out to start a stop
        self.hold = max([len(s) for s in (self.sequences if self.token_level else self.strings)] + [1]) - 1

    def _ids(self, text: str) -> list[int]:
        try:
            return encode_prompt(self.corpus, text)
        except ConfigError:
            raise ConfigError(f"--stop {text!r}: corpus {self.corpus.name!r} is token-level, so a stop is token ids "
                              f"0..{self.corpus.vocab_size - 1} separated by spaces") from None

    def __bool__(self) -> bool:
        return bool(self.ids or self.strings)

    def match(self, new: list[int]):
        """The stop that `new` (a continuation so far) has just reached, or None."""
        if new and new[-1] in self.ids:
            return new[-1]
        if self.token_level:
            return next((s for s, seq in zip(self.strings, self.sequences) if new[-len(seq):] == seq), None)
        if self.strings:
            text = self.corpus.decode(new)
            return next((s for s in self.strings if s in text), None)
        return None

    def text(self, new: list[int], stop) -> str:
        """The continuation's text, before its stop (None: it has none)."""
        if stop is None:
            return self.corpus.decode(new)
        if isinstance(stop, int):
            return self.corpus.decode(new[:-1])
        if self.token_level:
            return self.corpus.decode(new[:len(new) - len(self.sequences[self.strings.index(stop)])])
        text = self.corpus.decode(new)
        return text[:min(text.find(s) for s in self.strings if s in text)]

    def settled(self, new: list[int]) -> str:
        """The text of `new` that no stop can take back any more."""
        if self.token_level:
            return self.corpus.decode(new[:max(0, len(new) - self.hold)])
        text = self.corpus.decode(new)
        return text[:len(text) - self.hold] if self.hold else text


class TextStream:
    """Writes the text of sequence 0's tokens so far as it grows (a byte-level BPE token can end
    inside a character: text is written only up to the last complete one; text that may be the
    start of a stop string waits until it is not); finish(text) writes the rest of its final text."""

    def __init__(self, corpus, write, stops: Stops):
        self.corpus, self.write, self.stops, self.ids, self.shown, self.ended = corpus, write, stops, [], "", False

    def _show(self, text: str) -> None:
        if text.startswith(self.shown) and len(text) > len(self.shown):
            self.write(text[len(self.shown):])
            self.shown = text

    def __call__(self, step, token):
        if self.ended:
            return  # the rest is padding
        self.ids.append(int(token[0]))
        if self.stops.match(self.ids) is not None:
            self.ended = True  # finish() writes the text before the stop
            return
        text = self.stops.settled(self.ids)
        if self.corpus.tokenizer() is None:
            text += " " if text else ""
        elif text.endswith("\ufffd"):
            return
        self._show(text)

    def finish(self, text: str) -> None:
        self._show(text + (" " if self.corpus.tokenizer() is None and text else ""))


def generate_from_run(run_dir: Path, prompt, max_new_tokens: int = 100, *, temperature: float = 1.0,
                      top_k: int = 0, top_p: float = 1.0, seed: int = 0, device: str = "auto",
                      backend: str | None = None, max_context: int = MAX_CONTEXT, write=None, note=None,
                      progress: bool = False, stop=(), stop_ids=(), cuda_graph: bool | None = None,
                      memory_check: bool = True) -> dict:
    """Load a run and continue `prompt` (a str), or several prompts (a list of str) as one batch.
    With one prompt, write(str) hears its text as it is produced. note(str) hears what takes time
    before the first token (reading a long prompt can take minutes on a CPU) and the prefill's rate;
    progress shows a bar over the prompts' layers while they are read. stop: strings that end a
    continuation (left out of its text; token ids separated by spaces on a token-level corpus);
    stop_ids: token ids that end one. cuda_graph: decode with a CUDA graph (None: where there is CUDA).
    Every setting (the backend on the device, the cache's memory unless not memory_check) is
    checked before the model is loaded.

    Returns {"outputs": [{"prompt", "prompt_tokens", "new_tokens" (the stop's tokens included), "text" (the
    stop left out), "stop" (the stop reached, or None)} per prompt], "prefill_s", "decode_s",
    "prefill_tokens_per_s", "tokens_per_s", "ms_per_token", "decoding", "method", "device", ...}; for
    a str prompt also its output's keys."""
    from ..config import resolve_device
    from ..runs import load_model, open_run_corpus, run_config, run_weights
    from .checks import check_device, with_backend
    from .precision import autocast_for

    check_settings(max_new_tokens, temperature, top_k, top_p)
    dev = resolve_device(device, "--device")
    if cuda_graph and dev.type != "cuda":
        raise ConfigError(f"--cuda-graph needs a CUDA device, and this runs on {dev}")
    texts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not texts:
        raise ConfigError("no prompt to continue")
    cfg = run_config(run_dir)
    if backend:
        cfg = with_backend(cfg, backend, device)  # the one check `lenx eval --backend` makes
    check_device(cfg, device, key="--device", training=False)
    corpus = open_run_corpus(run_dir, cfg)  # the corpus it was trained on, or a one-line error
    prompts = [encode_prompt(corpus, text) for text in texts]
    stops = Stops(corpus, stop, stop_ids)
    width = max(len(ids) for ids in prompts)
    if width + max_new_tokens > max_context:
        raise ConfigError(f"the prompt ({width} tokens) and {max_new_tokens} new tokens exceed the cache limit "
                          f"of {max_context} tokens (--max-context)")
    if memory_check:
        check_generate_memory(cfg, len(prompts), width, max_new_tokens, dev)
    model = load_model(cfg, run_weights(run_dir), dev, backend)
    graph = (dev.type == "cuda" and GRAPH_ON_CUDA) if cuda_graph is None else cuda_graph
    stream = TextStream(corpus, write, stops) if write is not None and len(prompts) == 1 else None
    what = f"the {width:,}-token prompt" if len(prompts) == 1 else f"{len(prompts)} prompts (up to {width:,} tokens)"
    if note is not None:
        note(f"reading {what} ({cfg.model.label}, {dev}) ...")
    bars = []  # the progress bar, made at the first layer read (when the number of layers is known)

    def layer_read(done, total):
        if not bars:
            from tqdm import tqdm

            bars.append(tqdm(total=total, desc="reading the prompt", unit="layer", dynamic_ncols=True, leave=False))
        bars[0].update(done - bars[0].n)

    found: list = [None] * len(prompts)

    def stop_if(b, new):
        found[b] = stops.match(new)
        return found[b] is not None

    def prefilled(tokens, seconds):
        for bar in bars:
            bar.close()
        if note is not None:
            note(f"read {tokens:,} prompt tokens in {seconds:.2f} s ({tokens / max(seconds, 1e-9):,.0f} tokens/s)")

    try:
        out = generate(model, [torch.tensor(ids) for ids in prompts], max_new_tokens, temperature=temperature,
                       top_k=top_k, top_p=top_p, seed=seed, autocast=lambda: autocast_for(dev, cfg.train.precision),
                       on_token=stream, stop_if=stop_if if stops else None, decoding="graph" if graph else "eager",
                       progress=layer_read if progress else None, on_prefill=prefilled)
    finally:
        for bar in bars:
            bar.close()
    outputs = []
    for b, ids in enumerate(prompts):
        new = out["tokens"][b, :out["lengths"][b]].tolist()
        outputs.append({"prompt": texts[b], "prompt_tokens": len(ids), "new_tokens": new, "text": stops.text(new, found[b]),
                        "stop": found[b]})
    if stream is not None:
        stream.finish(outputs[0]["text"])
    keys = ("prefill_s", "decode_s", "setup_s", "decode_steps", "prefill_tokens_per_s", "tokens_per_s",
            "batch_tokens_per_s", "ms_per_token", "decoding")
    result = {"run": str(run_dir), "method": cfg.model.label, "device": str(dev), "outputs": outputs,
              **{k: out[k] for k in keys}}
    return result | outputs[0] if isinstance(prompt, str) else result
