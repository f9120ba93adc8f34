"""RULER-style synthetic tasks (Hsieh et al. 2024), written as text generators over a corpus.

Every generator returns a `Case`: the pieces of text to hide in the haystack ("needles", each with
a depth in [0, 1]), a question that ends the input, and the short answer the model must produce.
lenx.evaluation.suite turns a case into exactly L tokens (haystack cut from the corpus's held-out
split) and scores it. Generators take a numpy Generator, so the cases depend only on the seed.

niah_single     one "The special magic number for <key> is <value>." at the depth; value a number,
                a word or a UUID-like string (by instance index). Chance ~0.
niah_multikey   the same with 3 distractor needles of other keys at random depths. Chance ~0.
niah_multivalue one key with 4 values stated at random depths around the depth; answer: all
                values in the order stated. Chance ~0.
niah_multiquery 4 keys; the question asks for 2 of them; answer both values in asked order.
vt              variable tracking: X1 = value, X2 = X1, ... (chain of 4) stated across the
                haystack; answer the chain's names in order. Chance ~0.
cwe             common-words extraction: a numbered word list (no haystack: the list fills the
                input) where 3 words occur far more often; answer them, most frequent first.
                Chance 1 / (n_words choose 3 ordered) ~ 0.
fwe             frequent-words extraction: coded words drawn from a Zipf law; answer the most
                frequent one. Chance 1 / n_coded (stated per case count).
"""

from dataclasses import dataclass, field

import numpy as np

GENERATOR_VERSION = 1
TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe")
WORDS = ("apple river stone candle garden silver window market orchard tiger violin marble pepper "
         "rocket forest planet copper lemon harbor castle piano falcon meadow desert").split()
KEYS = ("azure-fox", "brisk-owl", "calm-elk", "dusty-ram", "eager-yak", "fuzzy-cod", "grim-bee", "hazy-emu")


@dataclass
class Case:
    needles: list[tuple[str, float]]   # (text, depth)
    question: str
    answer: str                        # starts with a space; exact match compares stripped text
    once: list[str] = field(default_factory=list)   # strings that must occur exactly once in the input
    filler: bool = True                # False: the needles are the whole context (cwe, fwe)


def _value(kind: int, rng) -> str:
    if kind == 0:
        return str(int(rng.integers(1000000, 10000000)))
    if kind == 1:
        return str(rng.choice(WORDS))
    hexes = "".join(rng.choice(list("0123456789abcdef"), 12))
    return f"{hexes[:4]}-{hexes[4:8]}-{hexes[8:]}"


def _needle(key: str, value: str) -> str:
    return f" The special magic value for {key} is: {value}. "


def _depths(rng, n: int) -> list[float]:
    return [float(d) for d in rng.uniform(0, 1, n)]


def niah_single(rng, depth: float, i: int) -> Case:
    key, value = str(rng.choice(KEYS)), _value(i % 3, rng)
    return Case([(_needle(key, value), depth)], f" What is the special magic value for {key}? It is:",
                f" {value}", once=[f"{key} is: {value}."])   # a word value may also occur in the haystack


def niah_multikey(rng, depth: float, i: int) -> Case:
    keys = [str(k) for k in rng.choice(KEYS, 4, replace=False)]
    values = [_value(i % 3 if i % 3 != 1 else 0, rng) for _ in keys]   # words could repeat: numbers
    needles = [(_needle(keys[0], values[0]), depth)] + [
        (_needle(k, v), d) for k, v, d in zip(keys[1:], values[1:], _depths(rng, 3))]
    return Case(needles, f" What is the special magic value for {keys[0]}? It is:", f" {values[0]}",
                once=[f"{keys[0]} is: {values[0]}."])


def niah_multivalue(rng, depth: float, i: int) -> Case:
    key = str(rng.choice(KEYS))
    values = [str(v) for v in rng.choice(np.arange(1000000, 10000000), 4, replace=False)]
    spots = sorted(min(1.0, max(0.0, depth + d)) for d in rng.uniform(-0.1, 0.1, 4))
    return Case([(_needle(key, v), d) for v, d in zip(values, spots)],
                f" What are all the special magic values for {key}? They are:", " " + ", ".join(values),
                once=values)


def niah_multiquery(rng, depth: float, i: int) -> Case:
    keys = [str(k) for k in rng.choice(KEYS, 4, replace=False)]
    values = [str(v) for v in rng.choice(np.arange(1000000, 10000000), 4, replace=False)]
    spots = [depth] + _depths(rng, 3)
    asked = [0, int(rng.integers(1, 4))]
    return Case([(_needle(k, v), d) for k, v, d in zip(keys, values, spots)],
                f" What are the special magic values for {keys[asked[0]]} and {keys[asked[1]]}? They are:",
                " " + ", ".join(values[a] for a in asked), once=[values[a] for a in asked])


def vt(rng, depth: float, i: int, hops: int = 4) -> Case:
    names = ["".join(rng.choice(list("ABCDEFGHJKLMNPQRSTUVWXYZ"), 5)) for _ in range(hops)]
    value = str(int(rng.integers(10000, 100000)))
    lines = [f" VAR {names[0]} = {value}."] + [f" VAR {b} = {a}." for a, b in zip(names, names[1:])]
    spots = np.linspace(depth * 0.5, depth, hops)
    return Case([(line, float(d)) for line, d in zip(lines, spots)],
                f" Which variables are assigned the value {value}? Answer:", " " + " ".join(names),
                once=[f"= {value}."])   # the value is stated once (the question names it too)


def cwe(rng, depth: float, i: int, common: int = 3, rare: int = 12) -> Case:
    chosen = [str(w) for w in rng.choice(WORDS, common + rare, replace=False)]
    counts = [9, 7, 5][:common] + [1] * rare
    bag = [w for w, c in zip(chosen, counts) for _ in range(c)]
    rng.shuffle(bag)
    listing = " Words: " + ", ".join(bag) + "."
    return Case([(listing, 0.0)], " The three most common words in the list, most frequent first, are:",
                " " + ", ".join(chosen[:common]), filler=False)


def fwe(rng, depth: float, i: int, n_coded: int = 8, total: int = 40) -> Case:
    coded = ["".join(rng.choice(list("bcdfghklmnprstvz"), 4)) for _ in range(n_coded)]
    weights = 1 / np.arange(1, n_coded + 1) ** 1.5
    counts = np.maximum(1, np.round(weights / weights.sum() * total)).astype(int)
    counts[0] = max(counts[0], counts[1] + 2)    # a unique most frequent word
    bag = [w for w, c in zip(coded, counts) for _ in range(c)]
    rng.shuffle(bag)
    return Case([(" Coded text: " + " ".join(bag) + ".", 0.0)],
                " The most frequent coded word in the text is:", f" {coded[0]}", filler=False)


GENERATORS = {name: globals()[name] for name in TASKS}
# What guessing scores on exact match (the answer is one of many strings, so effectively zero, except fwe).
CHANCE = {name: 0.0 for name in TASKS} | {"fwe": 1 / 8}
