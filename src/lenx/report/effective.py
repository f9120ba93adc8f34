"""Effective length per method (`lenx compare`): the longest evaluated length up to which the
method's score stays within a fraction (FRACTION, 0.85) of its own score at its training length.

The rule (RULE, also written into compare.json), for every evaluated length L from T_train up:
- perplexity: ppl(L) <= ppl(T_train) / 0.85, i.e. the seed-mean NLL of the scored tokens at most
  -ln 0.85 = 0.163 nats above its value at T_train (in bits per byte, when compare.json's unit is
  bpb: at most -log2 0.85 bits above, the per-byte perplexity's ratio);
- suite exact match (lenx eval --task): acc(L) >= 0.85 x acc(T_train), averaged over depths and
  instances; undefined when acc(T_train) is at or below the task's chance level; a suite grid that
  starts above T_train (a task longer than the training length) is measured from its shortest length;
- suite answer log-probability: mean log p(L) >= mean log p(T_train) + ln 0.85 (the geometric-mean
  probability of the answer's tokens at least 0.85 of its value at T_train).
The effective length is the last L before the first length that breaks the rule (T_train itself
when the first longer one does); "reaches_longest" marks one that is the longest evaluated length
(the method may hold further). The perplexity's reference is its score at T_train on the same
tokens: the scored tokens at T_train when that length was evaluated, else ΔP's two terms (the last
delta_p_tokens of each window read with T_train tokens of input, and read at L), which every
eval.json since the 125M runs' second seeds keeps; otherwise there is none and a note says why.

Its interval: each length's margin (how far inside the rule it is) gets a 95% interval over
documents and seeds (perplexity: stats.same_seeds_difference of each seed's NLL at L and at
T_train, on the same windows) or over instances and seeds (suite: Student's t, the instances shared
by every seed, see _margin); "lo" is the effective length by the rule applied to each margin's
lower bound (within the rule even at the bound), "hi" by its upper bound. The bounds are pointwise,
not simultaneous over lengths: a rough range, not a 95% interval for the length itself.
"""

import json
import math
from pathlib import Path

import numpy as np

from ..evaluation.files import is_kept
from .stats import same_seeds_difference

FRACTION = 0.85
RULE = (f"the longest evaluated length L >= T_train such that at every evaluated length from T_train to L the score "
        f"stays within {FRACTION} of the method's own at T_train: perplexity ppl(L) <= ppl(T_train) / {FRACTION} "
        f"(mean NLL at most -ln {FRACTION} above; per byte: bits per byte at most -log2 {FRACTION} above), suite exact "
        f"match acc(L) >= {FRACTION} x acc(T_train), answer log-probability log p(L) >= log p(T_train) + ln "
        f"{FRACTION}; lo / hi: the same rule on the lower / upper bound of each length's 95% interval (pointwise)")


def longest_within(T: int, margins: dict[int, dict]) -> dict:
    """The effective length and its bounds from each longer length's margin ({L: {"margin", "lo",
    "hi"}}; >= 0 is within the rule)."""
    lengths = sorted(L for L in margins if L > T)

    def last(key: str) -> int:
        found = T
        for L in lengths:
            if margins[L][key] < 0:
                break
            found = L
        return found

    length = last("margin")
    return {"length": length, "lo": last("lo"), "hi": last("hi"),
            "reaches_longest": bool(lengths) and length == lengths[-1]}


def perplexity_effective(stacked: dict[int, np.ndarray], members: list[dict], terms, documents, boot: dict,
                         unit: str = "ppl") -> dict:
    """A method's effective length by its perplexity: stacked {L: [seeds, windows] window values of
    the scored tokens}, its runs (train_len, delta_p_tokens) and ΔP's terms (compare's: the last
    tokens read with T_train tokens of input, {L: the same tokens read at L}, their seeds), the
    reference when the training length was not evaluated."""
    T = members[0]["train_len"]
    if not isinstance(T, int):
        return {"note": "its eval.json names no training length"}
    if T in stacked:
        values, reference, where = stacked, stacked[T], f"the scored tokens at {T}"
    elif terms is not None and len(terms[2]) == len(members):
        values, reference = terms[1], terms[0]
        where = f"the last {members[0]['delta_p_tokens']} tokens read with {T} tokens of input (ΔP's terms)"
    else:
        return {"note": f"no score at its training length {T}: evaluate at {T} too (--lengths), or every seed again "
                        "with `lenx eval RUN` (for ΔP's terms)"}
    per_nat = math.log(2) if unit == "bpb" else 1.0
    threshold = -math.log(FRACTION) / per_nat
    margins = {}
    for L, v in sorted(values.items()):
        if L <= T:
            continue
        d = same_seeds_difference(v, reference, documents, scale="nll", **boot)
        margins[L] = {"margin": threshold - d["diff"], "lo": threshold - d["hi"], "hi": threshold - d["lo"],
                      "ratio": math.exp(d["diff"] * per_nat), "covers": d["covers"]}
    return longest_within(T, margins) | {"reference": where, "margins": {str(L): m for L, m in margins.items()}}


def _margin(a: np.ndarray, b: np.ndarray, scale: float, offset: float, level: float) -> dict:
    """mean(a) - scale x mean(b) + offset with a t interval: a [seeds, units at L], b [seeds, units at
    T_train], every seed scored on the same instances. The instances' part is the variance of the
    seed-mean score per instance over the instances; the seeds' part the spread of each seed's own
    margin (each seed's instance noise is in both: slightly wide, as lenx.report.stats says of its own)."""
    import scipy.stats

    value = float(a.mean() - scale * b.mean() + offset)
    parts = []
    ya, yb = a.mean(0), b.mean(0)
    if len(ya) > 1 and len(yb) > 1:
        parts.append((ya.var(ddof=1) / len(ya) + scale ** 2 * yb.var(ddof=1) / len(yb), len(ya) + len(yb) - 2))
    if a.shape[0] > 1:
        per_seed = a.mean(1) - scale * b.mean(1)
        parts.append((per_seed.var(ddof=1) / len(per_seed), len(per_seed) - 1))
    var = sum(v for v, _ in parts)
    half = 0.0
    if var > 0:
        dof = var ** 2 / sum(v ** 2 / k for v, k in parts)
        half = float(scipy.stats.t.ppf((1 + level) / 2, dof)) * math.sqrt(var)
    covers = {(True, True): "seeds and instances", (True, False): "instances only", (False, True): "seeds only",
              (False, False): "nothing"}[len(ya) > 1 and len(yb) > 1, a.shape[0] > 1]
    return {"margin": value, "lo": value - half, "hi": value + half, "covers": covers}


# --- the suite: each run's eval_<tasks>.json -------------------------------------------------------

SUITE_KEYS = ("lengths", "depths", "samples", "seed", "split")  # what fixes a suite file's instances


def suite_files(run: str) -> dict[str, dict]:
    """A run's latest suite results (eval_<tasks>.json with "tasks"; not those of a kept step, of a
    RoPE scaling or kept beside them), by file name; unreadable files are left out."""
    out = {}
    for path in sorted(Path(run).glob("eval_*.json")):
        if is_kept(path) or "_step" in path.name or "_rope-" in path.name:
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("tasks"), dict) and isinstance(data.get("lengths"), list):
            out[path.name] = data
    return out


def _units(result: dict, task: str, key: str, i: int, cases: bool) -> np.ndarray:
    """The scores at length index i: each instance's (key_cases), else each depth's cell (an older file)."""
    r = result["tasks"][task]
    return np.asarray(r[f"{key}_cases"][i] if cases else r[key][i], dtype=np.float64).ravel()


def _task_effective(results: list[dict], task: str, T: int, level: float) -> dict:
    """One task's effective lengths by exact match and by log-probability, over a method's seeds.
    Measured from the training length T, or, when the grid starts above it (a task's minimum can be
    longer than T), from the shortest length evaluated: "from" says which."""
    lengths = results[0]["lengths"]
    above = [L for L in lengths if L >= T]
    if not above:
        return {"note": f"no length from the training length {T} up was evaluated (lengths {lengths})"}
    T = above[0]
    cases = all(isinstance(r["tasks"][task].get("exact_cases"), list) for r in results)
    at = {L: {key: np.stack([_units(r, task, key, i, cases) for r in results]) for key in ("exact", "logprob")}
          for i, L in enumerate(lengths)}
    out = {"units": "instances" if cases else "depth cells (an older file without each instance's score)", "from": T}
    chance = results[0]["tasks"][task].get("chance", 0.0)
    for key, scale, offset in (("exact", FRACTION, 0.0), ("logprob", 1.0, -math.log(FRACTION))):
        ref = at[T][key]
        if key == "exact" and ref.mean() <= chance:
            out[key] = {"note": f"exact match {ref.mean():.2f} at {T} is at or below chance "
                                f"({chance:.2g}): nothing to fall from", "at_train_len": float(ref.mean()), "from": T}
            continue
        margins = {L: _margin(at[L][key], ref, scale, offset, level) for L in lengths if L > T}
        out[key] = longest_within(T, margins) | {"at_train_len": float(ref.mean()), "from": T,
                                                 "margins": {str(L): m for L, m in margins.items()}}
    return out


def suite_effective(groups: dict[str, list[dict]], level: float = 0.95) -> dict:
    """{file name: {"methods": {method: {task: {"exact", "logprob": effective length}}}, the settings}}
    over the suite files that every run of a method has; a file whose settings or instances differ
    between runs gets a "note" instead."""
    files: dict[str, dict[str, list[dict]]] = {}
    for method, members in groups.items():
        found = [suite_files(r["run"]) for r in members]
        for name in set.intersection(*(set(f) for f in found)):
            files.setdefault(name, {})[method] = [f[name] for f in found]
    out = {}
    for name, by_method in sorted(files.items()):
        every = [r for results in by_method.values() for r in results]
        first = every[0]
        if any(not all(isinstance(t, dict) for t in r["tasks"].values()) for r in every):
            out[name] = {"note": "a run's file holds a task that is not a score grid; evaluate it again"}
            continue
        differ = [key for key in SUITE_KEYS if any(r.get(key) != first.get(key) for r in every)]
        tasks = sorted(set.intersection(*(set(r["tasks"]) for r in every)), key=list(first["tasks"]).index)
        if differ or any(r["tasks"][t].get("instances") != first["tasks"][t].get("instances") for r in every
                         for t in tasks):
            out[name] = {"note": f"its runs were evaluated on other instances ({', '.join(differ) or 'instances'} "
                                 "differ): evaluate every run with the same --lengths, --depths, --samples"}
            continue
        try:
            methods = {method: {t: _task_effective(results, t, groups[method][0]["train_len"], level) for t in tasks}
                       for method, results in by_method.items()}
        except (KeyError, IndexError, TypeError, ValueError):  # grids that do not match their lengths and depths
            out[name] = {"note": "a run's file does not hold a score per length and depth; evaluate it again"}
            continue
        out[name] = {key: first.get(key) for key in SUITE_KEYS} | {"tasks": tasks, "methods": methods}
    return out
