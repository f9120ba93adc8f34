"""Tests for the CHE task generators (lenx.tasks.che)."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from lenx.tasks import TASKS, UnknownTaskError, get_task

NAMES = list(TASKS)
SHORT_LENGTHS = range(1, 61)
LONG_LENGTHS = (200, 500)


def _targets_of(targets: torch.Tensor, mask: torch.Tensor, row: int) -> list[int]:
    return targets[row][mask[row]].tolist()


# ----------------------------------------------------------------------
# Generators agree with the independent brute-force checkers
# ----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_generator_matches_brute_force(name):
    task = TASKS[name]
    plan = [(n, 8) for n in SHORT_LENGTHS] + [(n, 16) for n in LONG_LENGTHS]
    for n, batch in plan:
        rng = np.random.default_rng(1000 + n)
        inputs, targets, mask = task.sample(batch, n, rng)
        for row in range(batch):
            expected = task.check(inputs[row], n)
            assert _targets_of(targets, mask, row) == expected, (name, n, task.render(inputs[row].tolist()))


# ----------------------------------------------------------------------
# Layout: masks, blanks, id ranges, shapes
# ----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_layout(name):
    task = TASKS[name]
    for n in list(SHORT_LENGTHS) + list(LONG_LENGTHS):
        inputs, targets, mask = task.sample(4, n, np.random.default_rng(n))
        n_in, n_out = task.input_length(n), task.output_length(n)
        assert n_out >= 1
        assert inputs.shape == targets.shape == mask.shape == (4, n_in + n_out)
        assert inputs.dtype == targets.dtype == torch.long and mask.dtype == torch.bool
        # The mask covers exactly the last n_out positions.
        assert not mask[:, :n_in].any() and mask[:, n_in:].all()
        # Task tokens in range, blanks exactly at the output positions.
        blank = task.input_vocab
        assert ((inputs[:, :n_in] >= 0) & (inputs[:, :n_in] < blank)).all()
        assert (inputs[:, n_in:] == blank).all()
        # Targets are class ids at output positions and 0 elsewhere.
        assert (targets[:, :n_in] == 0).all()
        assert ((targets[mask] >= 0) & (targets[mask] < task.output_vocab)).all()
        assert task.input_vocab == len(task.symbols)


def test_modular_arithmetic_uses_largest_odd_length():
    task = TASKS["modular_arithmetic"]
    for n, n_in in [(1, 1), (2, 1), (3, 3), (10, 9), (41, 41)]:
        assert task.input_length(n) == n_in
        inputs, _, _ = task.sample(2, n, np.random.default_rng(0))
        assert inputs.shape == (2, n_in + 1)
    for name, task in TASKS.items():
        if name != "modular_arithmetic":
            assert all(task.input_length(n) == n for n in range(1, 30))


def test_output_lengths():
    expected = {
        "even_pairs": lambda n: 1,
        "modular_arithmetic": lambda n: 1,
        "parity_check": lambda n: 1,
        "cycle_navigation": lambda n: 1,
        "stack_manipulation": lambda n: n + 1,
        "reverse_string": lambda n: n,
        "modular_arithmetic_brackets": lambda n: 1,
        "solve_equation": lambda n: 1,
        "duplicate_string": lambda n: 2 * n,
        "missing_duplicate": lambda n: 1,
        "odds_first": lambda n: n,
        "binary_addition": lambda n: n + 1,
        "binary_multiplication": lambda n: n,
        "compute_sqrt": lambda n: (n + 1) // 2,
        "bucket_sort": lambda n: n,
    }
    assert set(expected) == set(TASKS)
    for name, fn in expected.items():
        assert [TASKS[name].output_length(n) for n in range(1, 50)] == [fn(n) for n in range(1, 50)]


def test_levels_and_vocabularies():
    levels = {task.level for task in TASKS.values()}
    assert levels == {"R", "DCF", "CS"}
    assert [t.name for t in TASKS.values() if t.level == "R"] == [
        "even_pairs",
        "modular_arithmetic",
        "parity_check",
        "cycle_navigation",
    ]
    assert sum(t.level == "DCF" for t in TASKS.values()) == 4
    assert sum(t.level == "CS" for t in TASKS.values()) == 7
    vocab = {name: (t.input_vocab, t.output_vocab) for name, t in TASKS.items()}
    assert vocab["modular_arithmetic"] == (8, 5)
    assert vocab["stack_manipulation"] == (5, 3)
    assert vocab["modular_arithmetic_brackets"] == (10, 5)
    assert vocab["solve_equation"] == (11, 5)
    assert vocab["missing_duplicate"] == (4, 2)
    assert vocab["binary_addition"] == vocab["binary_multiplication"] == (3, 3)
    assert vocab["bucket_sort"] == (5, 5)


# ----------------------------------------------------------------------
# Input structure (the distribution the original samples from)
# ----------------------------------------------------------------------


def _rows(name, n, batch=32, seed=0):
    task = TASKS[name]
    inputs, _, _ = task.sample(batch, n, np.random.default_rng(seed))
    return [row[: task.input_length(n)] for row in inputs.tolist()]


def test_expression_structure():
    for n in range(1, 40):
        for row in _rows("modular_arithmetic", n):
            assert all(t < 5 for t in row[0::2]) and all(t >= 5 for t in row[1::2])
        for row in _rows("modular_arithmetic_brackets", n):
            depth = 0
            for t in row:
                depth += (t == 8) - (t == 9)
                assert depth >= 0
            assert depth == 0
        if n >= 3:
            for row in _rows("solve_equation", n):
                assert row.count(9) == 1 and row.count(10) == 1  # one 'x', one '='
                assert row[-2] == 10 and row[-1] < 5
                assert row.count(7) == row.count(8)  # balanced '(' and ')'


def test_stack_and_binary_structure():
    for n in range(3, 40):
        for row in _rows("stack_manipulation", n):
            k = next((i for i, t in enumerate(row) if t >= 2), n)
            assert 1 <= k <= n - 1, row  # a non-empty initial stack, then actions
            assert all(t >= 2 for t in row[k:])
        for name in ("binary_addition", "binary_multiplication"):
            for row in _rows(name, n):
                assert row.count(2) == 1
                k = row.index(2)
                a, b = row[:k], row[k + 1 :]
                assert a and b and any(a) and any(b), row  # both operands non-zero
        for row in _rows("missing_duplicate", n):
            assert row.count(2) == 1 and (row[-1] == 3) == (n % 2 == 1)
        for row in _rows("compute_sqrt", n):
            assert any(row)


# ----------------------------------------------------------------------
# Hand-worked examples (from the original task docstrings) pin the checkers
# ----------------------------------------------------------------------


def _check(name, tokens):
    return TASKS[name].check(tokens, len(tokens))


def _encode(name, text):
    ids = {s: i for i, s in enumerate(TASKS[name].symbols)}
    return [ids[c] for c in text.split()]


def test_hand_examples():
    assert _check("even_pairs", [0, 0, 1, 1, 1, 0]) == [0]
    assert _check("even_pairs", [0, 1, 0, 1, 0, 0, 1]) == [1]
    assert _check("parity_check", [1, 0, 1, 0, 1, 0, 0]) == [1]
    assert _check("parity_check", [0, 1, 1, 1, 1]) == [0]
    assert _check("modular_arithmetic", _encode("modular_arithmetic", "1 + 2 x 3")) == [2]
    assert _check("modular_arithmetic", _encode("modular_arithmetic", "1 - 1 - 1")) == [4]
    assert _check("modular_arithmetic", _encode("modular_arithmetic", "0 x 1 + 4 x 3 - 2")) == [0]
    assert _check("cycle_navigation", _encode("cycle_navigation", "+1 -1 0 -1 -1")) == [3]
    assert _check("cycle_navigation", _encode("cycle_navigation", "+1 +1 +1 -1")) == [2]
    stack = _encode("stack_manipulation", "0 1 1 0 PUSH1 POP POP")
    assert _check("stack_manipulation", stack) == [1, 1, 0, 2, 0, 0, 0, 0]
    stack = _encode("stack_manipulation", "1 1 0 POP POP POP")
    assert _check("stack_manipulation", stack) == [2, 0, 0, 0, 0, 0, 0]
    assert _check("modular_arithmetic_brackets", _encode("modular_arithmetic_brackets", "( ( - 3 ) x ( 2 - 4 ) )")) == [1]
    assert _check("solve_equation", _encode("solve_equation", "( x - 3 ) = 4")) == [2]
    assert _check("solve_equation", _encode("solve_equation", "- x = 1")) == [4]
    assert _check("reverse_string", [0, 1, 1, 0, 1, 0]) == [0, 1, 0, 1, 1, 0]
    assert _check("duplicate_string", [1, 0, 1]) == [1, 0, 1, 1, 0, 1]
    assert _check("missing_duplicate", _encode("missing_duplicate", "0 1 1 0 0 ? 1 0")) == [1]
    assert _check("missing_duplicate", _encode("missing_duplicate", "1 0 1 1 ? 1 #")) == [0]
    assert _check("odds_first", [0, 0, 1, 1, 0, 1, 0, 1]) == [0, 1, 1, 1, 0, 1, 0, 0]
    # 4 + 22 = 26 = 0b11010, little-endian 01011, then end, padded to n + 1.
    assert _check("binary_addition", _encode("binary_addition", "0 0 1 + 0 1 1 0 1")) == [0, 1, 0, 1, 1, 2, 0, 0, 0, 0]
    # 4 * 22 = 88 = 0b1011000 -> 0001101, end, padded to n.
    assert _check("binary_multiplication", _encode("binary_multiplication", "0 0 1 x 0 1 1 0 1")) == [
        0, 0, 0, 1, 1, 0, 1, 2, 0,
    ]
    assert _check("compute_sqrt", [1, 0, 0, 1, 0, 1]) == [1, 1, 0]  # isqrt(37) = 6
    assert _check("compute_sqrt", [1, 1, 1]) == [1, 0]  # isqrt(7) = 2
    assert _check("bucket_sort", [1, 0, 2, 0, 4, 1, 1, 2]) == [0, 0, 1, 1, 1, 2, 2, 4]


def test_short_length_fillers():
    # Lengths below min_length follow the original's filler conventions.
    for name, task in TASKS.items():
        assert 1 <= task.min_length <= 3
        for n in range(1, task.min_length):
            inputs, targets, mask = task.sample(16, n, np.random.default_rng(n))
            for row in range(16):
                assert _targets_of(targets, mask, row) == task.check(inputs[row], n)
    _, targets, mask = TASKS["solve_equation"].sample(4, 2, np.random.default_rng(0))
    assert (targets[mask] == 0).all()
    assert TASKS["binary_multiplication"].sample(1, 2, np.random.default_rng(0))[1][0, -2:].tolist() == [0, 2]


# ----------------------------------------------------------------------
# Chance levels
# ----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_random_guessing_scores_chance(name):
    task = TASKS[name]
    assert task.chance == pytest.approx(1 / task.output_vocab)
    rng = np.random.default_rng(7)
    _, targets, mask = task.sample(512, 41, rng)
    truth = targets[mask]
    guesses = torch.from_numpy(rng.integers(0, task.output_vocab, size=truth.shape))
    accuracy = (guesses == truth).double().mean().item()
    # Binomial std is at most 0.5 / sqrt(512) ~ 0.022 for 1-output tasks.
    assert abs(accuracy - task.chance) < 0.07, accuracy


BALANCED = [
    "even_pairs",
    "modular_arithmetic",
    "parity_check",
    "cycle_navigation",
    "reverse_string",
    "solve_equation",
    "duplicate_string",
    "missing_duplicate",
    "odds_first",
]


@pytest.mark.parametrize("name", BALANCED)
def test_constant_guess_scores_chance_on_balanced_tasks(name):
    task = TASKS[name]
    _, targets, mask = task.sample(2048, 41, np.random.default_rng(3))
    truth = targets[mask]
    for c in range(task.output_vocab):
        accuracy = (truth == c).double().mean().item()
        assert abs(accuracy - task.chance) < 0.05, (c, accuracy)


def test_accuracy_mask_stops_at_terminator():
    for name, task in TASKS.items():
        inputs, targets, mask = task.sample(64, 20, np.random.default_rng(0))
        score = task.accuracy_mask(targets, mask)
        if task.terminator is None:
            assert torch.equal(score, mask)
            continue
        for row in range(64):
            out = targets[row][mask[row]].tolist()
            end = out.index(task.terminator)
            assert score[row][mask[row]].tolist() == [True] * (end + 1) + [False] * (len(out) - end - 1)
            assert not score[row][~mask[row]].any()


# ----------------------------------------------------------------------
# Determinism, errors, registry, speed
# ----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_determinism(name):
    task = TASKS[name]
    a = task.sample(32, 17, np.random.default_rng(123))
    b = task.sample(32, 17, np.random.default_rng(123))
    c = task.sample(32, 17, np.random.default_rng(124))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("name", NAMES)
def test_bad_lengths_raise(name):
    task = TASKS[name]
    rng = np.random.default_rng(0)
    for bad in (0, -1, -10):
        with pytest.raises(ValueError, match="length must be >= 1"):
            task.sample(4, bad, rng)
        with pytest.raises(ValueError, match="length must be >= 1"):
            task.output_length(bad)
    with pytest.raises(TypeError):
        task.sample(4, 3.0, rng)
    with pytest.raises(ValueError):
        task.sample(0, 5, rng)
    # numpy integer lengths (e.g. from rng.integers) are accepted
    assert task.sample(2, np.int64(5), rng)[0].shape[0] == 2


def test_get_task_and_unknown_names():
    for name in NAMES:
        assert get_task(name) is TASKS[name]
    assert get_task("missing_duplicate_string") is TASKS["missing_duplicate"]
    with pytest.raises(KeyError) as info:
        get_task("reverse_strng")
    message = str(info.value)
    assert "Did you mean 'reverse_string'?" in message
    assert all(name in message for name in NAMES)
    with pytest.raises(ValueError):
        get_task("nonsense")
    assert issubclass(UnknownTaskError, KeyError)
