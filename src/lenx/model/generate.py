"""Text generation from a trained run, token by token with a KV cache (`lenx generate`).

The prompt is read with the usual forward (the planner's backends), then each new token costs one
row of attention per layer against the cache (LM.prefill / LM.decode). Greedy decoding
(temperature 0) is deterministic; sampling is seeded.
"""

from contextlib import nullcontext
from pathlib import Path
import time

import torch

from ..config import ConfigError

MAX_CONTEXT = 32768


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


@torch.no_grad()
def generate(model, prompt: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, autocast=None, on_token=None) -> dict:
    """Continue prompt [B, T] (token ids on the model's device) by max_new_tokens tokens.
    on_token(step, tokens [B]) is called after each one (streaming). Returns {"tokens": [B, n] new
    ids, "prefill_s", "decode_s", "tokens_per_s" (new tokens per second of decoding, per sequence)}."""
    check_settings(max_new_tokens, temperature, top_k, top_p)
    autocast = autocast or nullcontext
    device = prompt.device
    generator = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16 if device.type == "cuda" else None
    cache = model.new_cache(prompt.shape[0], prompt.shape[1] + max_new_tokens, device, dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    with autocast():
        logits = model.prefill(prompt, cache)
    sync()
    t1 = time.perf_counter()
    new = []
    for step in range(max_new_tokens):
        token = sample_next(logits, temperature, top_k, top_p, generator)
        new.append(token)
        if on_token is not None:
            on_token(step, token)
        if step + 1 < max_new_tokens:
            with autocast():
                logits = model.decode(token[:, None], cache)[:, -1]
    sync()
    t2 = time.perf_counter()
    return {"tokens": torch.stack(new, 1), "prefill_s": t1 - t0, "decode_s": t2 - t1,
            "tokens_per_s": max_new_tokens / max(t2 - t1, 1e-9)}


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


class TextStream:
    """Writes the text of the tokens so far as it grows (a byte-level BPE token can end inside a
    character: text is written only up to the last complete one)."""

    def __init__(self, corpus, write):
        self.corpus, self.write, self.ids, self.shown = corpus, write, [], ""

    def __call__(self, step, token):
        self.ids.append(int(token[0]))
        text = self.corpus.decode(self.ids)
        if self.corpus.tokenizer() is None:
            text += " "
        elif text.endswith("\ufffd"):
            return
        if text.startswith(self.shown):
            self.write(text[len(self.shown):])
            self.shown = text


def generate_from_run(run_dir: Path, prompt: str, max_new_tokens: int = 100, *, temperature: float = 1.0,
                      top_k: int = 0, top_p: float = 1.0, seed: int = 0, device: str = "auto",
                      backend: str | None = None, max_context: int = MAX_CONTEXT, write=None, note=None) -> dict:
    """Load a run, continue `prompt` and stream the text to write(str) as it is produced; note(str)
    hears what takes time before the first token (reading a long prompt can take minutes on a CPU).
    Returns {"prompt_tokens", "new_tokens", "text", "prefill_s", "decode_s", "tokens_per_s", ...}."""
    from ..config import resolve_device
    from ..runs import load_model, open_run_corpus, run_config, run_weights
    from .precision import autocast_for

    check_settings(max_new_tokens, temperature, top_k, top_p)
    dev = resolve_device(device, "device")
    cfg = run_config(run_dir)
    corpus = open_run_corpus(run_dir, cfg)  # the corpus it was trained on, or a one-line error
    model = load_model(cfg, run_weights(run_dir), dev, backend)
    ids = encode_prompt(corpus, prompt)
    if len(ids) + max_new_tokens > max_context:
        raise ConfigError(f"the prompt ({len(ids)} tokens) and {max_new_tokens} new tokens exceed the cache limit "
                          f"of {max_context} tokens (--max-context)")
    stream = TextStream(corpus, write) if write is not None else None
    if note is not None:
        note(f"reading the {len(ids):,}-token prompt ({cfg.model.method}, {dev}) ...")
    out = generate(model, torch.tensor([ids], device=dev), max_new_tokens, temperature=temperature, top_k=top_k,
                   top_p=top_p, seed=seed, autocast=lambda: autocast_for(dev, cfg.train.precision), on_token=stream)
    new = out["tokens"][0].tolist()
    return {"run": str(run_dir), "method": cfg.model.method, "prompt_tokens": len(ids), "new_tokens": new,
            "text": corpus.decode(new), "prefill_s": out["prefill_s"], "decode_s": out["decode_s"],
            "tokens_per_s": out["tokens_per_s"], "device": str(dev)}
