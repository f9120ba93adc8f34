"""The RULER-style and BABILong-style suites (lenx.evaluation.ruler, lenx.evaluation.babilong) on a trained LM.

A generator's case becomes exactly L tokens: haystack text cut from the held-out split at a seeded
position, the needles inserted at their depths (in token positions of the haystack), the question
last. Two scores per (length, depth) cell: "exact", the share of cases whose greedy continuation
(KV-cache generation, lenx.model.generate) starts with the answer, and "logprob", the mean
per-token log-probability of the answer's tokens given the input (teacher-forced). The cases depend
only on the corpus, split, seed, task, length, depth and case index; their SHA-256 ("instances"),
the generator versions and the corpus fingerprint go into the result. A token-level corpus (no
tokenizer) gets the token-level variant of the RULER-style tasks (lenx.evaluation.ruler_tokens).
"""

from contextlib import nullcontext
import hashlib

import numpy as np
import torch
from torch.nn import functional as F

from ..config import ConfigError
from . import babilong, ruler, ruler_tokens

GENERATORS = ruler.GENERATORS | babilong.GENERATORS
CHANCE = ruler.CHANCE | babilong.CHANCE   # the token-level variant's too (ruler_tokens says why)
GROUPS = {"ruler": ruler.TASKS, "babilong": babilong.TASKS}
VERSION = {"ruler": ruler.GENERATOR_VERSION, "babilong": babilong.GENERATOR_VERSION}
TOKEN_VERSION = {"ruler_tokens": ruler_tokens.GENERATOR_VERSION}


def parse_tasks(text: str) -> list[str]:
    """"ruler", "babilong" or a comma list of suite task names -> the task names; ConfigError otherwise."""
    names: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        names += list(GROUPS.get(part, [part]))
    unknown = [n for n in names if n not in GENERATORS]
    if unknown or not names:
        raise ConfigError(f"unknown suite task {unknown[0] if unknown else text!r}; choose ruler, babilong or "
                          f"a comma list of {', '.join(GENERATORS)}")
    return list(dict.fromkeys(names))


def is_suite(text: str) -> bool:
    return all(p.strip() in GENERATORS or p.strip() in GROUPS for p in text.split(","))


def _rng(seed: int, task: str, L: int, depth: float, i: int) -> np.random.Generator:
    salt = int.from_bytes(hashlib.sha256(task.encode()).digest()[:4], "little")
    return np.random.default_rng([seed, salt, L, int(round(depth * 1000)), i])


def build_case(corpus, task: str, L: int, depth: float, i: int, seed: int, split: str = "test") -> dict:
    """One input of exactly L tokens: {"input": ids, "answer": ids of the answer, "answer_text",
    "once", "tokens": whether it is the token-level variant (lenx.evaluation.ruler_tokens)}."""
    tokens = corpus.tokenizer() is None
    if tokens and task not in ruler_tokens.GENERATORS:
        raise ConfigError(f"the {task} task is reasoning over sentences; corpus {corpus.name!r} is token-level, "
                          f"where only the RULER-style tasks run ({', '.join(ruler_tokens.GENERATORS)})")
    rng = _rng(seed, task, L, depth, i)
    if tokens:
        case = ruler_tokens.GENERATORS[task](rng, depth, i, np.delete(np.arange(corpus.vocab_size), corpus.eos_id))
        enc = lambda s: np.asarray(s, dtype=np.int64)  # noqa: E731
    else:
        case = GENERATORS[task](rng, depth, i)
        enc = lambda s: np.array(corpus.encode(s), dtype=np.int64)  # noqa: E731
    needles = [(enc(text), d) for text, d in case.needles]
    question = enc(case.question)
    n_fill = L - sum(len(n) for n, _ in needles) - len(question)
    if n_fill < 0:
        raise ConfigError(f"length {L} is below the {task} task's minimum of {L - n_fill} tokens")
    stream = corpus.tokens(split)
    if len(stream) < n_fill:
        raise ConfigError(f"the {split} split has {len(stream)} tokens, fewer than the {n_fill} one "
                          f"{task} input at length {L} needs")
    start = int(rng.integers(0, len(stream) - n_fill + 1))
    fill = np.asarray(stream[start:start + n_fill], dtype=np.int64)
    # cwe / fwe: the list is the context; haystack text before it keeps every input at L tokens
    spots = sorted(((int(round(d * n_fill)) if case.filler else n_fill), k) for k, (_, d) in enumerate(needles))
    parts, at = [], 0
    for spot, k in spots:
        parts += [fill[at:spot], needles[k][0]]
        at = spot
    ids = np.concatenate(parts + [fill[at:], question])
    answer = enc(case.answer)
    return {"input": ids, "answer": answer, "answer_text": corpus.decode(answer) if tokens else case.answer.strip(),
            "once": case.once, "tokens": tokens}


def instances_hash(cases: list[dict]) -> str:
    h = hashlib.sha256()
    for c in cases:
        h.update(c["input"].tobytes())
        h.update(c["answer"].tobytes())
    return h.hexdigest()


@torch.no_grad()
def score_case(model, case: dict, decode, device, autocast) -> tuple[float, float]:
    """(exact match of the greedy continuation, mean log-probability of the answer's tokens)."""
    from ..model.generate import generate

    ids = torch.from_numpy(case["input"]).to(device)[None]
    answer = torch.from_numpy(case["answer"]).to(device)[None]
    with autocast():
        logits = model(torch.cat([ids, answer[:, :-1]], 1))[0][:, -answer.shape[1]:]
    logprob = -F.cross_entropy(logits.float()[0], answer[0]).item()
    new = generate(model, ids, answer.shape[1] + 2, temperature=0, autocast=autocast)["tokens"][0].tolist()
    if case.get("tokens"):   # token ids: a text comparison would take "12 34 5" for the start of "12 34 56"
        return float(new[:len(case["answer"])] == case["answer"].tolist()), logprob
    return float(decode(new).strip().startswith(case["answer_text"])), logprob


def run_suite(model, corpus, tasks: list[str], lengths: list[int], depths, samples: int = 8, seed: int = 1234,
              split: str = "test", device=None, autocast=None, progress=None, score=None) -> dict:
    """Every task on lengths x depths -> {"task": "suite", "tasks": {name: {"exact", "logprob": grids
    [len(lengths)][len(depths)], "exact_cases", "logprob_cases": each case's score [lengths][depths][samples]
    (what the intervals of lenx compare resample), "chance", "instances"}}, ...}. All cases are built (and checked)
    before any scoring, so bad input fails before work starts. score(model, case) overrides scoring
    (tests: oracle, random and uniform models)."""
    built = {t: [[[build_case(corpus, t, L, d, i, seed, split) for i in range(samples)] for d in depths]
                 for L in lengths] for t in tasks}
    if score is None:
        device = device or next(model.parameters()).device
        score = lambda m, c: score_case(m, c, corpus.decode, device, autocast or nullcontext)  # noqa: E731
    out = {}
    for t in tasks:
        grids = {"exact": [], "logprob": [], "exact_cases": [], "logprob_cases": []}
        for row in built[t]:
            for grid in grids.values():
                grid.append([])
            for cell in row:
                scores = [score(model, c) for c in cell]
                grids["exact"][-1].append(float(np.mean([s[0] for s in scores])))
                grids["logprob"][-1].append(float(np.mean([s[1] for s in scores])))
                grids["exact_cases"][-1].append([float(s[0]) for s in scores])
                grids["logprob_cases"][-1].append([round(float(s[1]), 6) for s in scores])
                if progress is not None:
                    progress(t)
        cases = [c for row in built[t] for cell in row for c in cell]
        out[t] = grids | {"chance": CHANCE[t], "instances": instances_hash(cases)}
    return {"task": "suite", "tasks": out, "lengths": list(lengths), "depths": list(depths), "samples": samples,
            "seed": seed, "split": split, "generator_version": TOKEN_VERSION if corpus.tokenizer() is None else VERSION,
            "corpus_fingerprint": corpus.fingerprint()}

