"""BABILong-style reasoning in a haystack (Kuratov et al. 2024), from the bAbI task definitions.

People move between places and pick up / drop objects; the supporting facts are spread through
the corpus's held-out text up to the depth (depth 0: all at the start; 1: spread over the whole
input), and a question ends the input. The answer is one place name (chance 1 / len(PLACES)).

qa1  single supporting fact: "Where is Mary?" after several moves (the last move of Mary answers).
qa2  two supporting facts: someone picks up an object and then moves; "Where is the football?".
qa3  three supporting facts: an object carried through two places; "Where was the football
     before the <last place>?".
"""

from .ruler import Case

GENERATOR_VERSION = 1
TASKS = ("qa1", "qa2", "qa3")
PEOPLE = ("Mary", "John", "Sandra", "Daniel")
PLACES = ("bathroom", "hallway", "garden", "office", "kitchen", "bedroom")
OBJECTS = ("football", "apple", "milk")
CHANCE = {name: 1 / len(PLACES) for name in TASKS}


def _spread(facts: list[str], depth: float) -> list[tuple[str, float]]:
    n = len(facts)
    return [(f" {f}", depth * (k + 1) / n) for k, f in enumerate(facts)]


def _moves(rng, n: int, people) -> list[tuple[str, str]]:
    return [(str(rng.choice(people)), str(rng.choice(PLACES))) for _ in range(n)]


def qa1(rng, depth: float, i: int) -> Case:
    moves = _moves(rng, 5, PEOPLE)
    who = moves[-1][0] if i % 2 else moves[int(rng.integers(0, 5))][0]
    where = [p for w, p in moves if w == who][-1]
    return Case(_spread([f"{w} went to the {p}." for w, p in moves], depth), f" Where is {who}? Answer: the",
                f" {where}")


def qa2(rng, depth: float, i: int) -> Case:
    who, thing = str(rng.choice(PEOPLE)), str(rng.choice(OBJECTS))
    others = [p for p in PEOPLE if p != who]
    start, end = (str(p) for p in rng.choice(PLACES, 2, replace=False))
    facts = [f"{who} went to the {start}.", f"{who} picked up the {thing}."]
    facts += [f"{w} went to the {p}." for w, p in _moves(rng, 2, others)]
    facts += [f"{who} travelled to the {end}."]
    return Case(_spread(facts, depth), f" Where is the {thing}? Answer: the", f" {end}")


def qa3(rng, depth: float, i: int) -> Case:
    who, thing = str(rng.choice(PEOPLE)), str(rng.choice(OBJECTS))
    a, b, c = (str(p) for p in rng.choice(PLACES, 3, replace=False))
    facts = [f"{who} went to the {a}.", f"{who} grabbed the {thing}.", f"{who} went to the {b}.",
             f"{who} journeyed to the {c}."]
    return Case(_spread(facts, depth), f" Where was the {thing} before the {c}? Answer: the", f" {b}")


GENERATORS = {"qa1": qa1, "qa2": qa2, "qa3": qa3}
