"""The 15 Chomsky-hierarchy (CHE) tasks of Deletang et al. 2023.

The definitions follow the task code used by Ruoss et al. 2023 (randomized
positional encodings), which is the setup the length-extrapolation literature
reports against: same vocabularies, output lengths, sampling distributions and
even the conventions for lengths too short to hold a real instance.  Every
place where we deviate, or where the original was ambiguous, is said in the
task's docstring under "Choice".

Layout of a sample (`Task.sample`)::

    position  0 .. n_in-1           n_in .. n_in+n_out-1
    inputs    task input tokens     BLANK (= input_vocab)
    targets   0                     output class ids
    mask      False                 True

`n_in = task.input_length(n)` (equal to `n` for every task except
modular_arithmetic, which needs an odd length) and `n_out =
task.output_length(n)`.  A model embeds `input_vocab + 1` input ids and
predicts `output_vocab` classes at the masked positions; the score is the
masked per-token argmax accuracy.

Chance level: `chance = 1 / output_vocab` for every task, i.e. the expected
per-token accuracy of a predictor that guesses uniformly at random.  An
input-independent *majority* guess can beat it where outputs are skewed (the
zero padding after the terminator of stack_manipulation / binary_addition /
binary_multiplication, the position-dependent symbols of bucket_sort, the
0-heavy products of modular_arithmetic_brackets).  The original benchmark
scored the terminator tasks only up to and including the terminator;
`Task.accuracy_mask` reproduces that.

Each task also has an independent brute-force checker (`Task.check`) used by
the tests: it recomputes the expected targets from the decoded input with a
different method than the generator (Python's `eval`, list simulation,
`sorted`, Python big integers, ...).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

__all__ = [
    "Task",
    "TASKS",
    "TASK_ALIASES",
    "UnknownTaskError",
    "get_task",
]

MODULUS = 5  # all modular tasks of the benchmark work modulo 5


def _validate_length(length: int) -> int:
    # bool is an int subclass; reject it so `sample(b, True, rng)` is not n=1.
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
        raise TypeError(f"length must be an int, got {type(length).__name__}")
    if length < 1:
        raise ValueError(f"length must be >= 1 (the input length n), got {length}")
    return int(length)


@dataclass(frozen=True)
class Task:
    """A seeded CHE task generator (see the module docstring for the layout).

    Attributes:
        name: registry key.
        level: "R" (regular), "DCF" (deterministic context-free) or "CS"
            (context-sensitive), as classified by Deletang et al.
        input_vocab: number of input symbols, NOT counting the blank; the blank
            id is `input_vocab`.
        output_vocab: number of output classes.
        chance: 1 / output_vocab (uniform random guessing, see module doc).
        symbols: a printable name per input id (used by `render` and by the
            expression checkers).
        min_length: smallest n that yields a genuine instance; below it the
            original's filler convention applies (documented per task), so
            every n >= 1 can be sampled, as in the original training curriculum.
        terminator: the output class that ends a variable-length answer (then
            padded with class 0), or None.
    """

    name: str
    level: str
    input_vocab: int
    output_vocab: int
    chance: float
    symbols: tuple[str, ...]
    min_length: int = 1
    terminator: int | None = None

    # --- per-task hooks -------------------------------------------------
    def input_length(self, length: int) -> int:
        """Number of input tokens actually produced for a requested length."""
        return _validate_length(length)

    def output_length(self, length: int) -> int:
        """Number of output (blank, scored) positions for input length n."""
        _validate_length(length)
        return 1

    def _generate(
        self, rng: np.random.Generator, batch: int, n: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Returns (tokens [batch, n], outputs [batch, output_length]) as ints."""
        raise NotImplementedError

    def _brute_force(self, tokens: list[int], n_out: int) -> list[int]:
        """Independent recomputation of the outputs from one decoded input."""
        raise NotImplementedError

    # --- public API -----------------------------------------------------
    def sample(
        self, batch: int, length: int, rng: np.random.Generator
    ) -> tuple[torch.LongTensor, torch.LongTensor, torch.BoolTensor]:
        """Samples `(inputs, targets, mask)`, each `[batch, n_in + n_out]`.

        `length` is the input length n (>= 1); `n_in = input_length(n)` and
        `n_out = output_length(n)`.  All randomness comes from `rng`, so the
        same seed gives the same batch.
        """
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        n_in = self.input_length(length)
        n_out = self.output_length(length)
        tokens, outputs = self._generate(rng, int(batch), n_in)
        assert tokens.shape == (batch, n_in), (self.name, tokens.shape)
        assert outputs.shape == (batch, n_out), (self.name, outputs.shape)

        total = n_in + n_out
        inputs = np.full((batch, total), self.input_vocab, dtype=np.int64)
        inputs[:, :n_in] = tokens
        targets = np.zeros((batch, total), dtype=np.int64)
        targets[:, n_in:] = outputs
        mask = np.zeros((batch, total), dtype=bool)
        mask[:, n_in:] = True
        return torch.from_numpy(inputs), torch.from_numpy(targets), torch.from_numpy(mask)

    def check(self, inputs_row: Sequence[int] | torch.Tensor, length: int) -> list[int]:
        """Brute-force expected targets (length `output_length(length)`).

        `inputs_row` is one row of `sample`'s `inputs` (blanks may be included;
        only the first `input_length(length)` tokens are read).
        """
        n_in = self.input_length(length)
        n_out = self.output_length(length)
        if isinstance(inputs_row, torch.Tensor):
            inputs_row = inputs_row.tolist()
        tokens = [int(t) for t in list(inputs_row)[:n_in]]
        if len(tokens) != n_in:
            raise ValueError(f"expected at least {n_in} input tokens, got {len(tokens)}")
        expected = self._brute_force(tokens, n_out)
        assert len(expected) == n_out, (self.name, len(expected), n_out)
        return expected

    def accuracy_mask(self, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The original benchmark's scoring mask.

        For tasks with a terminator it keeps the output positions up to and
        including the first terminator (the zero padding after it is not
        scored); otherwise it is `mask` itself.  Train on `mask`, report
        accuracy on this to match Ruoss et al.
        """
        if self.terminator is None:
            return mask
        is_end = (targets == self.terminator) & mask
        # Positions strictly after the first terminator have seen one before.
        seen_before = (torch.cumsum(is_end.long(), dim=-1) - is_end.long()) > 0
        return mask & ~seen_before

    def render(self, tokens: Sequence[int]) -> str:
        """Human-readable input string; the blank is shown as '_'."""
        names = self.symbols + ("_",)
        return " ".join(names[int(t)] for t in tokens)


# ======================================================================
# Shared helpers
# ======================================================================


def _uniform_int(draw: Callable[[], float], high: int) -> int:
    """Uniform int in [0, high) from a pre-drawn uniform float in [0, 1)."""
    return min(int(draw() * high), high - 1)


def _nonzero_operand_bits(
    rng: np.random.Generator, batch: int, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Two non-zero little-endian operands packed as `a <op> b` in n tokens.

    The split point is uniform (len_a in [1, n-2], len_b = n-1-len_a) and each
    operand is uniform over the non-zero values of its width (leading zeros
    allowed), as in the original.  Returns (bits [B, n], len_a, a, b) where a
    and b are [B, n] digit arrays starting at column 0 (zero beyond their
    width); column len_a of `bits` is free for the operator token.
    """
    len_a = rng.integers(1, n - 1, size=batch)
    pos = np.arange(n)[None, :]
    in_a = pos < len_a[:, None]
    in_b = pos > len_a[:, None]
    bits = rng.integers(0, 2, size=(batch, n))
    # Rejection sampling gives the uniform law over non-zero values.
    while True:
        bad = ~((bits * in_a).any(1) & (bits * in_b).any(1))
        if not bad.any():
            break
        bits[bad] = rng.integers(0, 2, size=(int(bad.sum()), n))
    a = np.where(in_a, bits, 0)
    # Shift b so that its least-significant digit sits at column 0.
    src = np.clip(pos + len_a[:, None] + 1, 0, n - 1)
    b = np.where(pos < (n - 1 - len_a)[:, None], np.take_along_axis(bits, src, 1), 0)
    return bits, len_a, a, b


def _terminated(digits: np.ndarray, n_out: int, end: int) -> np.ndarray:
    """Minimal little-endian digits, then `end`, then zero padding to n_out.

    `digits` is [B, W] little-endian; the minimal form keeps at least one digit
    (so zero is written "0").
    """
    batch, width = digits.shape
    nonzero = digits != 0
    last = np.where(nonzero.any(1), width - 1 - np.argmax(nonzero[:, ::-1], axis=1), 0)
    used = last + 1
    assert (used < n_out).all(), "answer does not fit the output length"
    out = np.zeros((batch, n_out), dtype=np.int64)
    keep = min(width, n_out)
    out[:, :keep] = digits[:, :keep]
    out[np.arange(batch), used] = end
    return out


def _little_endian_answer(value: int, n_out: int, end: int) -> list[int]:
    """Checker side of `_terminated`, written with Python's big integers."""
    digits = [int(c) for c in reversed(format(value, "b"))]
    return digits + [end] + [0] * (n_out - len(digits) - 1)


def _eval_mod(expression: str) -> int:
    """Python's own arithmetic on the rendered expression, reduced mod 5."""
    value = eval(expression, {"__builtins__": {}}, {})  # noqa: S307 - our own digits/operators only
    return ((value % MODULUS) + MODULUS) % MODULUS


# ======================================================================
# Regular tasks
# ======================================================================


class EvenPairs(Task):
    """even_pairs (R).

    Input: n bits (ids 0, 1).  Output: 1 token, 2 classes: the number of
    "01" plus "10" substrings mod 2, i.e. class 0 when that count is even and
    1 when it is odd (as in the original).  The count is even exactly when the
    first and last bits are equal, which is how the generator computes it.
    n = 1 has no pairs -> class 0.  Chance 1/2.
    """

    def _generate(self, rng, batch, n):
        bits = rng.integers(0, 2, size=(batch, n))
        return bits, (bits[:, :1] != bits[:, -1:]).astype(np.int64)

    def _brute_force(self, tokens, n_out):
        changes = sum(1 for a, b in zip(tokens, tokens[1:]) if a != b)
        return [changes % 2]


class ModularArithmetic(Task):
    """modular_arithmetic (R).

    Input: an expression `d op d op ... d` alternating digits 0-4 (ids 0-4)
    with operators '+' (5), '-' (6), 'x' (7), all uniform.  Standard
    precedence: 'x' binds tighter, '+'/'-' are left-associative.  Output: 1
    token, the value mod 5 (5 classes).  Chance 1/5.

    Choice (original convention): the expression needs an odd length, so an
    even requested n produces n - 1 input tokens (`input_length(n)`; the
    returned tensors are then [B, n]).  The original's unused blank-operator
    symbol is dropped from the vocabulary.
    """

    def input_length(self, length):
        length = _validate_length(length)
        return length if length % 2 == 1 else length - 1

    def _generate(self, rng, batch, n):
        digits = rng.integers(0, MODULUS, size=(batch, n // 2 + 1))
        ops = rng.integers(5, 8, size=(batch, n // 2))
        tokens = np.empty((batch, n), dtype=np.int64)
        tokens[:, 0::2] = digits
        tokens[:, 1::2] = ops
        # Left-to-right scan: `term` is the running product of the current
        # additive term (with its sign), `total` the sum of finished terms.
        total = np.zeros(batch, dtype=np.int64)
        term = digits[:, 0] % MODULUS
        for k in range(ops.shape[1]):
            op, d = ops[:, k], digits[:, k + 1]
            is_mul = op == 7
            total = np.where(is_mul, total, (total + term) % MODULUS)
            signed = np.where(op == 5, d, -d)
            term = np.where(is_mul, term * d, signed) % MODULUS
        return tokens, ((total + term) % MODULUS)[:, None]

    def _brute_force(self, tokens, n_out):
        text = "".join(self.symbols[t] for t in tokens).replace("x", "*")
        return [_eval_mod(text)]


class ParityCheck(Task):
    """parity_check (R).

    Input: n bits.  Output: 1 token, the number of 1s mod 2 (2 classes).
    Chance 1/2.
    """

    def _generate(self, rng, batch, n):
        bits = rng.integers(0, 2, size=(batch, n))
        return bits, (bits.sum(1) % 2)[:, None]

    def _brute_force(self, tokens, n_out):
        odd = False
        for t in tokens:
            if t == 1:
                odd = not odd
        return [int(odd)]


class CycleNavigation(Task):
    """cycle_navigation (R).

    Input: n moves on a cycle of 5 states starting at 0: id 0 = step -1,
    id 1 = stay, id 2 = step +1 (the original's code: move = id - 1; its
    docstring's wording differs, the code is what was trained on).  Output: 1
    token, the final state (5 classes).  Chance 1/5.
    """

    def _generate(self, rng, batch, n):
        moves = rng.integers(0, 3, size=(batch, n))
        return moves, ((moves - 1).sum(1) % MODULUS)[:, None]

    def _brute_force(self, tokens, n_out):
        step = {0: -1, 1: 0, 2: +1}
        state = 0
        for t in tokens:
            state = (state + step[t]) % 5
        return [state]


# ======================================================================
# Deterministic context-free tasks
# ======================================================================


class StackManipulation(Task):
    """stack_manipulation (DCF).

    Input: an initial stack of k bits given bottom-to-top (ids 0, 1), then
    n - k actions: POP (2), PUSH 0 (3), PUSH 1 (4).  k is uniform in
    [1, n-1] and actions uniform (original); n = 1 is a lone one-bit stack.
    POP on an empty stack does nothing.  Output: the final stack top-to-bottom,
    then the terminator (class 2), then class 0 padding, output length n + 1
    (room for the largest possible stack plus the terminator).  3 classes,
    chance 1/3.  `mask` covers all n + 1 positions, the original scored only
    up to the terminator (`accuracy_mask`).
    """

    def output_length(self, length):
        return _validate_length(length) + 1

    def _generate(self, rng, batch, n):
        stack_len = rng.integers(1, max(n - 1, 1) + 1, size=batch)
        bits = rng.integers(0, 2, size=(batch, n))
        actions = rng.integers(2, 5, size=(batch, n))
        tokens = np.where(np.arange(n)[None, :] < stack_len[:, None], bits, actions)

        # The initial bits are just pushes, so one loop runs the whole input.
        rows = np.arange(batch)
        stack = np.zeros((batch, n), dtype=np.int64)
        size = np.zeros(batch, dtype=np.int64)
        for t in range(n):
            tok = tokens[:, t]
            push = tok != 2
            value = np.where(tok < 2, tok, tok - 3)
            stack[rows[push], size[push]] = value[push]
            size = np.where(push, size + 1, np.maximum(size - 1, 0))

        # Read the stack top-first into the output, then the terminator.
        j = np.arange(n + 1)[None, :]
        src = size[:, None] - 1 - j
        top_first = np.take_along_axis(stack, np.clip(src, 0, n - 1), 1)
        out = np.where(src >= 0, top_first, 0)
        out[rows, size] = 2
        return tokens, out

    def _brute_force(self, tokens, n_out):
        stack: list[int] = []
        for i, t in enumerate(tokens):
            if t in (0, 1):
                assert all(u in (0, 1) for u in tokens[:i]), "bits after an action"
                stack.append(t)
            elif t == 2:
                if stack:
                    stack.pop()
            else:
                stack.append(0 if t == 3 else 1)
        answer = stack[::-1] + [2]
        return answer + [0] * (n_out - len(answer))


class ReverseString(Task):
    """reverse_string (DCF).

    Input: n bits.  Output: the bits reversed, output length n, 2 classes,
    chance 1/2.
    """

    def output_length(self, length):
        return _validate_length(length)

    def _generate(self, rng, batch, n):
        bits = rng.integers(0, 2, size=(batch, n))
        return bits, bits[:, ::-1].copy()

    def _brute_force(self, tokens, n_out):
        return list(reversed(tokens))


def _emit_expression(
    length: int, ops: str, draw: Callable[[], float], out: list[str]
) -> int:
    """Appends a random bracketed expression of exactly `length` symbols.

    The original grammar: lengths 1-4 are `d`, `-d`, `(d)`, `(-d)`; a longer
    expression is `(L op R)` with len(L) uniform in [1, length-4] and the
    operator uniform over `ops`.  Returns the value mod 5.  Recursion depth is
    at most length/4, fine for the lengths used (<= ~3000).
    """
    if length <= 4:
        digit = _uniform_int(draw, MODULUS)
        negate = length in (2, 4)
        core = ["-", str(digit)] if negate else [str(digit)]
        out.extend(["(", *core, ")"] if length >= 3 else core)
        return (-digit) % MODULUS if negate else digit
    left_len = 1 + _uniform_int(draw, length - 4)
    op = ops[_uniform_int(draw, len(ops))]
    out.append("(")
    left = _emit_expression(left_len, ops, draw, out)
    out.append(op)
    right = _emit_expression(length - 3 - left_len, ops, draw, out)
    out.append(")")
    if op == "+":
        return (left + right) % MODULUS
    if op == "-":
        return (left - right) % MODULUS
    return (left * right) % MODULUS


def _draws(rng: np.random.Generator, batch: int, n: int) -> list[Callable[[], float]]:
    """One stream of pre-drawn uniforms per sample (fast, seed-determined)."""
    # An expression of n symbols has I <= (n-1)/4 inner nodes (2 draws each)
    # and I+1 leaves (1 draw each): at most n draws, +1 for solve_equation.
    table = rng.random((batch, n + 2))
    return [iter(row.tolist()).__next__ for row in table]


class ModularArithmeticBrackets(Task):
    """modular_arithmetic_brackets (DCF).

    Input: a random bracketed expression of exactly n symbols over digits 0-4
    (ids 0-4), '+' (5), '-' (6), 'x' (7), '(' (8), ')' (9), generated by the
    original's grammar (see `_emit_expression`: `d`, `-d`, `(d)`, `(-d)` for
    lengths 1-4, otherwise `(L op R)` with a uniform split and operator; the
    benchmark uses mult=True, so 'x' is included).  Output: 1 token, the value
    mod 5 (5 classes).  Chance 1/5.
    """

    def _generate(self, rng, batch, n):
        ids = {s: i for i, s in enumerate(self.symbols)}
        tokens = np.empty((batch, n), dtype=np.int64)
        values = np.empty((batch, 1), dtype=np.int64)
        for b, draw in enumerate(_draws(rng, batch, n)):
            out: list[str] = []
            values[b, 0] = _emit_expression(n, "+-x", draw, out)
            tokens[b] = [ids[s] for s in out]
        return tokens, values

    def _brute_force(self, tokens, n_out):
        text = "".join(self.symbols[t] for t in tokens).replace("x", "*")
        return [_eval_mod(text)]


class SolveEquation(Task):
    """solve_equation (DCF).

    Input: `E = v`, where E is a bracketed expression of n - 2 symbols from
    the modular_arithmetic_brackets grammar with '+' and '-' only (the
    original's default mult=False, so E is linear in x with coefficient +-1
    and the solution is unique), one of whose digits is replaced by the
    unknown 'x', and v = value(E) mod 5.  Ids: digits 0-4, '+' 5, '-' 6,
    '(' 7, ')' 8, 'x' 9, '=' 10.  Output: 1 token, the hidden digit (5
    classes).  Chance 1/5.

    Choices (both the original's): the hidden digit is found by drawing a
    uniform position in E and walking right (cyclically) to the next digit,
    so digits after long operator/bracket runs are picked more often.  n < 3
    cannot hold `x=v`: the original's filler (all-'0' input, class 0) is
    returned; `min_length` is 3.
    """

    def _generate(self, rng, batch, n):
        if n < 3:
            return np.zeros((batch, n), dtype=np.int64), np.zeros((batch, 1), dtype=np.int64)
        ids = {s: i for i, s in enumerate(self.symbols)}
        tokens = np.empty((batch, n), dtype=np.int64)
        answers = np.empty((batch, 1), dtype=np.int64)
        for b, draw in enumerate(_draws(rng, batch, n)):
            expr: list[str] = []
            value = _emit_expression(n - 2, "+-", draw, expr)
            pos = _uniform_int(draw, n - 2)
            while not expr[pos].isdigit():
                pos = (pos + 1) % (n - 2)
            answers[b, 0] = int(expr[pos])
            expr[pos] = "x"
            tokens[b] = [ids[s] for s in expr + ["=", str(value)]]
        return tokens, answers

    def _brute_force(self, tokens, n_out):
        text = "".join(self.symbols[t] for t in tokens)
        if "=" not in text:  # filler for n < 3
            return [0]
        lhs, rhs = text.split("=")
        # Try every value of x; a linear equation mod 5 has exactly one root.
        roots = [c for c in range(MODULUS) if _eval_mod(lhs.replace("x", f"({c})")) == int(rhs)]
        assert len(roots) == 1, (text, roots)
        return roots


# ======================================================================
# Context-sensitive tasks
# ======================================================================


class DuplicateString(Task):
    """duplicate_string (CS).

    Input: n bits s.  Output: ss, output length 2n, 2 classes, chance 1/2.
    """

    def output_length(self, length):
        return 2 * _validate_length(length)

    def _generate(self, rng, batch, n):
        bits = rng.integers(0, 2, size=(batch, n))
        return bits, np.concatenate([bits, bits], axis=1)

    def _brute_force(self, tokens, n_out):
        return tokens * 2


class MissingDuplicate(Task):
    """missing_duplicate (CS), the original's missing_duplicate_string.

    Input (n tokens in total): a bit string s of length n // 2 written twice,
    ss, with one uniformly chosen position replaced by the mask token (id 2);
    for odd n a pad token (id 3) is appended.  Output: 1 token, the masked
    bit (2 classes).  Chance 1/2.

    Choice (original's filler): n = 1 cannot hold ss; the input is the single
    token 1 and the answer is 1.  `min_length` is 2.
    """

    def _generate(self, rng, batch, n):
        if n == 1:
            return np.ones((batch, 1), dtype=np.int64), np.ones((batch, 1), dtype=np.int64)
        half = n // 2
        s = rng.integers(0, 2, size=(batch, half))
        doubled = np.concatenate([s, s], axis=1)
        hole = rng.integers(0, 2 * half, size=batch)
        rows = np.arange(batch)
        answer = doubled[rows, hole].copy()
        doubled[rows, hole] = 2
        if n % 2:
            doubled = np.concatenate([doubled, np.full((batch, 1), 3)], axis=1)
        return doubled, answer[:, None]

    def _brute_force(self, tokens, n_out):
        if len(tokens) == 1:
            return [1]
        body = tokens[:-1] if tokens[-1] == 3 else tokens
        half = len(body) // 2
        hole = body.index(2)
        twin = hole + half if hole < half else hole - half
        return [body[twin]]


class OddsFirst(Task):
    """odds_first (CS).

    Input: n bits s_0 ... s_{n-1} (0-indexed).  Output: the symbols at odd
    indices, then those at even indices: s_1 s_3 ... s_0 s_2 ...; output
    length n, 2 classes, chance 1/2.

    Choice: this is the original *code* (`[1::2]` then `[::2]`); the
    original docstring's 1-indexed examples put s_0 first instead.  The two
    readings are mirror images of the same task.
    """

    def output_length(self, length):
        return _validate_length(length)

    def _generate(self, rng, batch, n):
        bits = rng.integers(0, 2, size=(batch, n))
        return bits, np.concatenate([bits[:, 1::2], bits[:, 0::2]], axis=1)

    def _brute_force(self, tokens, n_out):
        odds = [t for i, t in enumerate(tokens) if i % 2 == 1]
        evens = [t for i, t in enumerate(tokens) if i % 2 == 0]
        return odds + evens


class BinaryAddition(Task):
    """binary_addition (CS).

    Input: `a + b` with a and b little-endian binary (ids 0, 1), '+' = id 2;
    the split is uniform (len(a) in [1, n-2]) and each operand uniform over
    the non-zero values of its width, leading zeros allowed (original).
    Output: a + b little-endian without trailing zeros, the terminator
    (class 2), then class 0 padding; output length n + 1.  3 classes, chance
    1/3.  `accuracy_mask` scores only up to the terminator, as the original.

    Choice (original's filler): n <= 2 cannot hold `a+b`; the input is a lone
    n-bit number a (read as a + 0) and the answer is a.  We draw a uniformly
    from all n-bit values (the original excluded 2**n - 1 by an off-by-one).
    `min_length` is 3.
    """

    def output_length(self, length):
        return _validate_length(length) + 1

    def _generate(self, rng, batch, n):
        n_out = n + 1
        if n <= 2:
            bits = rng.integers(0, 2, size=(batch, n))
            return bits, _terminated(bits, n_out, end=2)
        bits, len_a, a, b = _nonzero_operand_bits(rng, batch, n)
        bits[np.arange(batch), len_a] = 2
        # Ripple-carry addition, one column at a time for the whole batch.
        total = np.zeros((batch, n + 1), dtype=np.int64)
        carry = np.zeros(batch, dtype=np.int64)
        for j in range(n):
            s = a[:, j] + b[:, j] + carry
            total[:, j] = s & 1
            carry = s >> 1
        total[:, n] = carry
        return bits, _terminated(total, n_out, end=2)

    def _brute_force(self, tokens, n_out):
        def little_endian(ds):
            return int("".join(map(str, reversed(ds))), 2) if ds else 0

        if 2 not in tokens:  # filler for n <= 2
            return _little_endian_answer(little_endian(tokens), n_out, 2)
        k = tokens.index(2)
        return _little_endian_answer(little_endian(tokens[:k]) + little_endian(tokens[k + 1 :]), n_out, 2)


class BinaryMultiplication(Task):
    """binary_multiplication (CS).

    Input: `a x b`, sampled exactly as binary_addition's `a + b` ('x' = id 2).
    Output: a * b little-endian without trailing zeros, the terminator
    (class 2), then class 0 padding; output length n (the product has at most
    len(a) + len(b) = n - 1 digits).  3 classes, chance 1/3.
    `accuracy_mask` scores only up to the terminator, as the original.

    Choice (original's filler): n <= 2 cannot hold `a x b`; the input is n
    random bits and the answer is the fixed `[terminator]` (n = 1) or
    `[0, terminator]` (n = 2).  `min_length` is 3.
    """

    def output_length(self, length):
        return _validate_length(length)

    def _generate(self, rng, batch, n):
        if n <= 2:
            bits = rng.integers(0, 2, size=(batch, n))
            out = np.zeros((batch, n), dtype=np.int64)
            out[:, -1] = 2
            return bits, out
        bits, len_a, a, b = _nonzero_operand_bits(rng, batch, n)
        bits[np.arange(batch), len_a] = 2
        # Schoolbook product: column sums of the digit convolution, then carry.
        columns = np.zeros((batch, 2 * n), dtype=np.int64)
        for i in range(int(len_a.max())):
            columns[:, i : i + n] += a[:, i : i + 1] * b
        product = np.zeros((batch, 2 * n), dtype=np.int64)
        carry = np.zeros(batch, dtype=np.int64)
        for j in range(2 * n):
            s = columns[:, j] + carry
            product[:, j] = s & 1
            carry = s >> 1
        return bits, _terminated(product, n, end=2)

    def _brute_force(self, tokens, n_out):
        if 2 not in tokens:  # filler for n <= 2
            return [0] * (n_out - 1) + [2]
        k = tokens.index(2)
        a = sum(d << i for i, d in enumerate(tokens[:k]))
        b = sum(d << i for i, d in enumerate(tokens[k + 1 :]))
        return _little_endian_answer(a * b, n_out, 2)


class ComputeSqrt(Task):
    """compute_sqrt (CS).

    Input: n bits, a big-endian number x uniform over [1, 2**n - 1] (leading
    zeros allowed).  Output: floor(sqrt(x)) big-endian, zero-padded on the
    left to exactly ceil(n / 2) digits (x < 2**n so the root fits).  2
    classes, chance 1/2.
    """

    def output_length(self, length):
        return math.ceil(_validate_length(length) / 2)

    def _generate(self, rng, batch, n):
        bits = rng.integers(0, 2, size=(batch, n))
        while True:  # rejection gives the uniform law over non-zero x
            zero = ~bits.any(1)
            if not zero.any():
                break
            bits[zero] = rng.integers(0, 2, size=(int(zero.sum()), n))
        m = math.ceil(n / 2)
        # Big integers through bytes: pad on the left to whole bytes.
        packed = np.packbits(np.pad(bits, ((0, 0), ((-n) % 8, 0))).astype(np.uint8), axis=1)
        out_bytes = (m + 7) // 8
        out = np.empty((batch, m), dtype=np.int64)
        for r in range(batch):
            root = math.isqrt(int.from_bytes(packed[r].tobytes(), "big"))
            root_bits = np.unpackbits(np.frombuffer(root.to_bytes(out_bytes, "big"), dtype=np.uint8))
            out[r] = root_bits[-m:]
        return bits, out

    def _brute_force(self, tokens, n_out):
        x = int("".join(map(str, tokens)), 2)
        # Build the root bit by bit from the top: keep a bit if its square fits.
        root = 0
        for k in reversed(range(n_out)):
            candidate = root | (1 << k)
            if candidate * candidate <= x:
                root = candidate
        return [(root >> (n_out - 1 - i)) & 1 for i in range(n_out)]


class BucketSort(Task):
    """bucket_sort (CS).

    Input: n symbols uniform over {0, ..., 4}.  Output: the same symbols
    sorted increasingly, output length n, 5 classes, chance 1/5.
    """

    def output_length(self, length):
        return _validate_length(length)

    def _generate(self, rng, batch, n):
        symbols = rng.integers(0, 5, size=(batch, n))
        return symbols, np.sort(symbols, axis=1)

    def _brute_force(self, tokens, n_out):
        return sorted(tokens)


# ======================================================================
# Registry
# ======================================================================

_BITS = ("0", "1")
_DIGITS = tuple(str(d) for d in range(MODULUS))

TASKS: dict[str, Task] = {
    task.name: task
    for task in [
        EvenPairs("even_pairs", "R", 2, 2, 1 / 2, _BITS),
        ModularArithmetic("modular_arithmetic", "R", 8, 5, 1 / 5, _DIGITS + ("+", "-", "x")),
        ParityCheck("parity_check", "R", 2, 2, 1 / 2, _BITS),
        CycleNavigation("cycle_navigation", "R", 3, 5, 1 / 5, ("-1", "0", "+1")),
        StackManipulation(
            "stack_manipulation", "DCF", 5, 3, 1 / 3, _BITS + ("POP", "PUSH0", "PUSH1"), terminator=2
        ),
        ReverseString("reverse_string", "DCF", 2, 2, 1 / 2, _BITS),
        ModularArithmeticBrackets(
            "modular_arithmetic_brackets", "DCF", 10, 5, 1 / 5, _DIGITS + ("+", "-", "x", "(", ")")
        ),
        SolveEquation(
            "solve_equation", "DCF", 11, 5, 1 / 5, _DIGITS + ("+", "-", "(", ")", "x", "="), min_length=3
        ),
        DuplicateString("duplicate_string", "CS", 2, 2, 1 / 2, _BITS),
        MissingDuplicate("missing_duplicate", "CS", 4, 2, 1 / 2, _BITS + ("?", "#"), min_length=2),
        OddsFirst("odds_first", "CS", 2, 2, 1 / 2, _BITS),
        BinaryAddition("binary_addition", "CS", 3, 3, 1 / 3, _BITS + ("+",), min_length=3, terminator=2),
        BinaryMultiplication(
            "binary_multiplication", "CS", 3, 3, 1 / 3, _BITS + ("x",), min_length=3, terminator=2
        ),
        ComputeSqrt("compute_sqrt", "CS", 2, 2, 1 / 2, _BITS),
        BucketSort("bucket_sort", "CS", 5, 5, 1 / 5, _DIGITS),
    ]
}

# Names used by the original code base.
TASK_ALIASES: dict[str, str] = {"missing_duplicate_string": "missing_duplicate"}


class UnknownTaskError(KeyError, ValueError):
    """Unknown task name; catchable as KeyError or ValueError."""

    def __str__(self) -> str:  # KeyError would show the repr of the message
        return str(self.args[0])


def get_task(name: str) -> Task:
    """Returns the registered task, accepting the original's names too."""
    key = TASK_ALIASES.get(name, name)
    if key in TASKS:
        return TASKS[key]
    known = list(TASKS) + list(TASK_ALIASES)
    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f" Did you mean {TASK_ALIASES.get(close[0], close[0])!r}?" if close else ""
    raise UnknownTaskError(f"Unknown task {name!r}.{hint} Valid tasks: {', '.join(TASKS)}.")
