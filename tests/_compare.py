"""Comparing regenerated results with committed ones without depending on the last bits of
floating-point arithmetic (another numpy, scipy or CPU changes a bootstrap figure in its 15th digit).

- same_json: a recursive comparison; keys, strings, booleans, None and integers equal exactly,
  floats within a relative tolerance (1e-9 by default, far above rounding noise, far below any
  printed digit).
- same_text: text split into numbers and the rest; the rest (words, verdicts, table cells' layout)
  equal exactly, a number within one unit of its last printed digit (0.883 against 0.884 passes,
  against 0.885 fails); a plain count such as `64` must be equal.

Each returns a list of differences (empty: the same), so an assertion can print where they differ.
"""

import math
import re

REL = 1e-9
ABS = 1e-12

# a number as the reports print it: an optional sign, digits, an optional fraction and exponent; not
# digits inside a word or a name (T128, s0, H200 stay text, compared exactly), nor a range's dash (1-7)
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def same_json(made, committed, rel: float = REL, abs_tol: float = ABS, path: str = "$") -> list[str]:
    """Where two parsed JSON values differ beyond the float tolerance, as `$.claims[3].hi: 1.2 != 1.3`."""
    if isinstance(made, bool) or isinstance(committed, bool) or made is None or committed is None:
        return [] if made is committed or made == committed and type(made) is type(committed) else \
            [f"{path}: {made!r} != {committed!r}"]
    if isinstance(made, float) or isinstance(committed, float):
        both_numbers = all(isinstance(x, (int, float)) for x in (made, committed))
        if both_numbers and (math.isclose(made, committed, rel_tol=rel, abs_tol=abs_tol)
                             or (math.isnan(made) and math.isnan(committed))):
            return []
        return [f"{path}: {made!r} != {committed!r}"]
    if type(made) is not type(committed):
        return [f"{path}: {type(made).__name__} {made!r} != {type(committed).__name__} {committed!r}"]
    if isinstance(made, dict):
        if list(made) != list(committed):
            return [f"{path}: keys {list(made)} != {list(committed)}"]
        return [d for k in made for d in same_json(made[k], committed[k], rel, abs_tol, f"{path}.{k}")]
    if isinstance(made, list):
        if len(made) != len(committed):
            return [f"{path}: {len(made)} items != {len(committed)}"]
        return [d for i, (x, y) in enumerate(zip(made, committed)) for d in same_json(x, y, rel, abs_tol, f"{path}[{i}]")]
    return [] if made == committed else [f"{path}: {made!r} != {committed!r}"]


def _unit(token: str) -> float:
    """One unit of a printed number's last digit: 0.001 for `0.883`, 1 for `+133`, 1e-5 for `1.2e-4`."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 10.0 ** (int(exponent or 0) - decimals)


def _is_count(token: str) -> bool:
    return token.isdigit()  # no sign, point or exponent: a count, a length, an id


def same_text(made: str, committed: str) -> list[str]:
    """Where two texts differ: a non-number part that is not identical, or numbers further apart than
    one unit of the last printed digit (of the coarser of the two); counts must be equal."""
    if NUMBER.split(made) != NUMBER.split(committed):  # the text around the numbers (and so their count)
        lines_a, lines_b = made.splitlines(), committed.splitlines()
        for line, (x, y) in enumerate(zip(lines_a, lines_b), 1):
            if NUMBER.split(x) != NUMBER.split(y):
                return [f"line {line}: {x!r} != {y!r}"]
        return [f"{len(lines_a)} lines != {len(lines_b)}"]
    out = []
    for a, b in zip(NUMBER.finditer(made), NUMBER.finditer(committed)):
        x, y = a.group(), b.group()
        if x == y:
            continue
        line = made.count("\n", 0, a.start()) + 1
        if _is_count(x) or _is_count(y):
            out.append(f"line {line}: {x} != {y}")
        elif abs(float(x) - float(y)) > max(_unit(x), _unit(y)) * (1 + 1e-9):
            out.append(f"line {line}: {x} != {y} (more than one unit of the last digit apart)")
    return out
