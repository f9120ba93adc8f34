"""Retrieval at length on a trained LM: can it use far-away tokens?

passkey  a random 5-digit key, stated twice ("The pass key is 71432. Remember it. 71432 is the pass
         key.") at a chosen depth inside filler text; the input ends with "What is the pass key? The
         pass key is" (Mohtashami & Jaggi 2023). Scored
         by exact match of the greedy continuation's first five digits and by the mean
         log-probability of the key's tokens (teacher-forced).
copy     a span of `span` tokens placed at a chosen depth inside filler; at the end its first `shown`
         tokens are repeated and the model reads the rest teacher-forced. Scored by the accuracy of
         its argmax predictions of the rest (the induction ability of the DAPE V2 paper's
         Proposition 1).

Every input has exactly L tokens. Filler and spans are cut from the held-out split's token stream
(documents joined by EOS) at seeded positions; the inputs depend only on the corpus, split, seed,
length, depth and sample index, never on the method. depth 0 puts the needle first, depth 1 right
before the question.
"""

from contextlib import nullcontext

import numpy as np
import torch
from torch.nn import functional as F

from ..config import ConfigError

TASKS = ("passkey", "copy")
QUESTION = " What is the pass key? The pass key is"
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _rng(seed: int, L: int, depth: float, i: int) -> np.random.Generator:
    return np.random.default_rng([seed, L, int(round(depth * 1000)), i])


def _cut(stream: np.ndarray, n: int, rng) -> np.ndarray:
    if len(stream) < n:
        raise ConfigError(f"the held-out split has {len(stream)} tokens, fewer than the {n} one input needs")
    start = int(rng.integers(0, len(stream) - n + 1))
    return np.asarray(stream[start:start + n], dtype=np.int64)


def _place(filler: np.ndarray, needle: np.ndarray, depth: float) -> np.ndarray:
    at = int(round(depth * len(filler)))
    return np.concatenate([filler[:at], needle, filler[at:]])


def passkey_inputs(corpus, split: str, L: int, depth: float, samples: int, seed: int) -> list[dict]:
    """[{"input": ids [L], "key": "71432", "answer": ids of " 71432"}] for one (length, depth)."""
    if corpus.tokenizer() is None:
        raise ConfigError(f"the passkey task needs text; corpus {corpus.name!r} is token-level (use --task copy)")
    stream = corpus.tokens(split)
    question = np.array(corpus.encode(QUESTION), dtype=np.int64)
    out = []
    for i in range(samples):
        rng = _rng(seed, L, depth, i)
        key = str(int(rng.integers(10000, 100000)))
        needle = np.array(corpus.encode(f" The pass key is {key}. Remember it. {key} is the pass key. "),
                          dtype=np.int64)
        n_fill = L - len(needle) - len(question)
        if n_fill < 0:
            raise ConfigError(f"length {L} is too short for the passkey needle and question "
                              f"({len(needle) + len(question)} tokens)")
        ids = np.concatenate([_place(_cut(stream, n_fill, rng), needle, depth), question])
        out.append({"input": ids, "key": key, "answer": np.array(corpus.encode(f" {key}"), dtype=np.int64)})
    return out


def copy_inputs(corpus, split: str, L: int, depth: float, samples: int, seed: int, span: int = 32,
                shown: int = 8) -> list[dict]:
    """[{"input": ids [L], "targets": the span's last span - shown tokens}] for one (length, depth):
    filler with the span at `depth`, then the span's first `shown` tokens and its rest."""
    if L < 2 * span:
        raise ConfigError(f"length {L} is too short for the copy task (at least {2 * span} tokens)")
    stream = corpus.tokens(split)
    out = []
    for i in range(samples):
        rng = _rng(seed, L, depth, i)
        piece = _cut(stream, span, rng)
        ids = np.concatenate([_place(_cut(stream, L - 2 * span, rng), piece, depth), piece])
        out.append({"input": ids, "targets": piece[shown:]})
    return out


@torch.no_grad()
def _passkey_cell(model, cases, decode, device, autocast) -> dict:
    from ..model.generate import generate

    exact, logprob = [], []
    for case in cases:
        ids = torch.from_numpy(case["input"]).to(device)[None]
        answer = torch.from_numpy(case["answer"]).to(device)[None]
        with autocast():
            logits = model(torch.cat([ids, answer[:, :-1]], 1))[0][:, -answer.shape[1]:]
        logprob.append(-F.cross_entropy(logits.float()[0], answer[0]).item())
        new = generate(model, ids, answer.shape[1] + 2, temperature=0, autocast=autocast)["tokens"][0]
        digits = "".join(c for c in decode(new.tolist()) if c.isdigit())[:5]
        exact.append(float(digits == case["key"]))
    return {"exact": float(np.mean(exact)), "logprob": float(np.mean(logprob))}


@torch.no_grad()
def _copy_cell(model, cases, device, autocast) -> dict:
    acc = []
    for case in cases:
        ids = torch.from_numpy(case["input"]).to(device)[None]
        n = len(case["targets"])
        with autocast():
            h = model.hidden(ids[:, :-1])[:, -n:]
            pred = model.lm_head(h).argmax(-1)[0].cpu().numpy()
        acc.append(float((pred == case["targets"]).mean()))
    return {"accuracy": float(np.mean(acc))}


def run_task(model, corpus, task: str, lengths: list[int], depths=DEPTHS, samples: int = 8, seed: int = 1234,
             split: str = "test", device=None, autocast=None, progress=None) -> dict:
    """The task on a grid of lengths x depths -> {"task", "lengths", "depths", "samples", "seed",
    and per score a [len(lengths)][len(depths)] grid}: passkey "exact" and "logprob", copy "accuracy"."""
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    if samples < 1 or not lengths or any(L < 1 for L in lengths) or any(not 0 <= d <= 1 for d in depths):
        raise ConfigError("retrieval needs samples >= 1, positive lengths and depths in [0, 1]")
    autocast = autocast or nullcontext
    device = device or next(model.parameters()).device
    grid: dict[str, list[list[float]]] = {}
    for L in lengths:
        for d in depths:
            if task == "passkey":
                cases = passkey_inputs(corpus, split, L, d, samples, seed)
                cell = _passkey_cell(model, cases, corpus.decode, device, autocast)
            else:
                cell = _copy_cell(model, copy_inputs(corpus, split, L, d, samples, seed), device, autocast)
            for key, value in cell.items():
                rows = grid.setdefault(key, [[] for _ in lengths])
                rows[lengths.index(L)].append(value)
            if progress is not None:
                progress(L, d, cell)
    return {"task": task, "lengths": list(lengths), "depths": list(depths), "samples": samples, "seed": seed,
            "split": split, **grid}


def chance(task: str, vocab_size: int) -> float:
    """What guessing scores: a passkey is one of 90000 keys; a copied token one of the vocabulary."""
    return 1 / 90000 if task == "passkey" else 1 / vocab_size

