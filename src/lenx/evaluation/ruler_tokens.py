"""The RULER-style tasks (lenx.evaluation.ruler) for a token-level corpus (the synthetic one: ids, no
text): the same structure, with every phrase replaced by token sequences drawn per instance from
the corpus's vocabulary (EOS excluded).

A "phrase" (the text tasks' "The special magic value for", "is:", "VAR", the question) becomes a
random marker of MARK tokens, a key KEY tokens, a value VALUE tokens. The question repeats the
needle's opening (marker, key, separator), so the answer is what followed it in the input:

niah_single      needle  M K S V; question  M K S; answer V.
niah_multikey    the same with 3 distractor needles of other keys at random depths.
niah_multivalue  one key stated with 4 values near the depth; question M K S; answer the 4 values.
niah_multiquery  4 key/value needles; question M K_a K_b S; answer V_a V_b.
vt               A N1 E V, A N2 E N1, ... (4 hops) up to the depth; question Q V E; answer N1..N4.
cwe              a list of 15 one-token words (counts 9, 7, 5 and twelve 1s) split by a separator;
                 question Q; answer the 3 common words, most frequent first.
fwe              8 coded words (2 tokens each, split by a separator) with Zipf counts; question Q;
                 answer the most frequent.

Chance (exact match of the answer's tokens): about (1/|vocab|)^len(answer) for the niah tasks and
vt; 1/2730 for cwe (the 3 of 15 words in order), 1/8 for fwe. The BABILong-style tasks have no
token-level variant: their facts are sentences about people, places and objects, whose words carry
the meaning (went, picked up, before) that a question about them needs.
"""

import numpy as np

from .ruler import Case

GENERATOR_VERSION = 1
MARK, KEY, VALUE = 2, 2, 3


def _seq(rng, symbols, n: int) -> np.ndarray:
    return rng.choice(symbols, n).astype(np.int64)


def _keys(rng, symbols, n: int) -> list[np.ndarray]:
    """n keys whose first tokens differ, so no key is another's."""
    first = rng.choice(symbols, n, replace=False)
    return [np.concatenate([[f], _seq(rng, symbols, KEY - 1)]).astype(np.int64) for f in first]


def _cat(*parts) -> np.ndarray:
    return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])


def niah_single(rng, depth: float, i: int, symbols) -> Case:
    mark, sep, key, value = _seq(rng, symbols, MARK), _seq(rng, symbols, 1), _keys(rng, symbols, 1)[0], \
        _seq(rng, symbols, VALUE)
    return Case([(_cat(mark, key, sep, value), depth)], _cat(mark, key, sep), value, once=[_cat(key, sep, value)])


def niah_multikey(rng, depth: float, i: int, symbols) -> Case:
    mark, sep, keys = _seq(rng, symbols, MARK), _seq(rng, symbols, 1), _keys(rng, symbols, 4)
    values = [_seq(rng, symbols, VALUE) for _ in keys]
    spots = [depth] + [float(d) for d in rng.uniform(0, 1, 3)]
    return Case([(_cat(mark, k, sep, v), d) for k, v, d in zip(keys, values, spots)], _cat(mark, keys[0], sep),
                values[0], once=[_cat(keys[0], sep, values[0])])


def niah_multivalue(rng, depth: float, i: int, symbols) -> Case:
    mark, sep, key = _seq(rng, symbols, MARK), _seq(rng, symbols, 1), _keys(rng, symbols, 1)[0]
    values = [_seq(rng, symbols, VALUE) for _ in range(4)]
    spots = sorted(min(1.0, max(0.0, depth + d)) for d in rng.uniform(-0.1, 0.1, 4))
    return Case([(_cat(mark, key, sep, v), d) for v, d in zip(values, spots)], _cat(mark, key, sep),
                _cat(*values), once=[_cat(key, sep, v) for v in values])


def niah_multiquery(rng, depth: float, i: int, symbols) -> Case:
    mark, sep, keys = _seq(rng, symbols, MARK), _seq(rng, symbols, 1), _keys(rng, symbols, 4)
    values = [_seq(rng, symbols, VALUE) for _ in keys]
    spots = [depth] + [float(d) for d in rng.uniform(0, 1, 3)]
    a, b = 0, int(rng.integers(1, 4))
    return Case([(_cat(mark, k, sep, v), d) for k, v, d in zip(keys, values, spots)],
                _cat(mark, keys[a], keys[b], sep), _cat(values[a], values[b]),
                once=[_cat(keys[a], sep, values[a]), _cat(keys[b], sep, values[b])])


def vt(rng, depth: float, i: int, symbols, hops: int = 4) -> Case:
    assign, eq, query = _seq(rng, symbols, MARK), _seq(rng, symbols, 1), _seq(rng, symbols, MARK)
    names, value = _keys(rng, symbols, hops), _seq(rng, symbols, VALUE)
    lines = [_cat(assign, names[0], eq, value)] + [_cat(assign, b, eq, a) for a, b in zip(names, names[1:])]
    spots = np.linspace(depth * 0.5, depth, hops)
    return Case([(line, float(d)) for line, d in zip(lines, spots)], _cat(query, value, eq), _cat(*names),
                once=[_cat(eq, value)])


def cwe(rng, depth: float, i: int, symbols, common: int = 3, rare: int = 12) -> Case:
    head, sep, query = _seq(rng, symbols, MARK), _seq(rng, symbols, 1), _seq(rng, symbols, MARK)
    words = rng.choice(np.setdiff1d(symbols, sep), common + rare, replace=False).astype(np.int64)
    counts = [9, 7, 5][:common] + [1] * rare
    bag = [w for w, c in zip(words, counts) for _ in range(c)]
    rng.shuffle(bag)
    listing = _cat(head, *[[w, sep[0]] for w in bag])
    return Case([(listing, 0.0)], query, words[:common], filler=False)


def fwe(rng, depth: float, i: int, symbols, n_coded: int = 8, total: int = 40) -> Case:
    head, sep, query = _seq(rng, symbols, MARK), _seq(rng, symbols, 1), _seq(rng, symbols, MARK)
    coded = _keys(rng, np.setdiff1d(symbols, sep), n_coded)   # the separator is no part of a word
    weights = 1 / np.arange(1, n_coded + 1) ** 1.5
    counts = np.maximum(1, np.round(weights / weights.sum() * total)).astype(int)
    counts[0] = max(counts[0], counts[1] + 2)    # a unique most frequent word
    bag = [w for w, c in zip(coded, counts) for _ in range(c)]
    rng.shuffle(bag)
    return Case([(_cat(head, *[_cat(w, sep) for w in bag]), 0.0)], query, coded[0], filler=False)


GENERATORS = {name: globals()[name] for name in ("niah_single", "niah_multikey", "niah_multivalue",
                                                 "niah_multiquery", "vt", "cwe", "fwe")}
