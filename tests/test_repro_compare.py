"""tests/_compare.py, the comparison of regenerated results with committed ones: a difference in
the last digits (another numpy, scipy or CPU) passes, a real difference or a changed word fails."""

from _compare import same_json, same_text


def test_json_floats_within_rounding_noise_pass_and_real_differences_fail():
    committed = {"claims": [{"id": "a", "verdict": "confirmed", "figures": [{"length": 512, "hi": 0.12552924372,
                                                                             "covers": "seeds and documents"}]}],
                 "resamples": 2000, "one_seed": False, "why": None}
    noisy = {"claims": [{"id": "a", "verdict": "confirmed", "figures": [{"length": 512, "hi": 0.12552924376,
                                                                         "covers": "seeds and documents"}]}],
             "resamples": 2000, "one_seed": False, "why": None}
    assert same_json(noisy, committed) == []
    assert same_json(committed | {"resamples": 2001}, committed) == ["$.resamples: 2001 != 2000"]
    moved = {**noisy, "claims": [{**noisy["claims"][0], "figures": [{**noisy["claims"][0]["figures"][0],
                                                                      "hi": 0.1256}]}]}
    assert same_json(moved, committed) == ["$.claims[0].figures[0].hi: 0.1256 != 0.12552924372"]
    changed = {**noisy, "claims": [{**noisy["claims"][0], "verdict": "inconclusive"}]}
    assert same_json(changed, committed) == ["$.claims[0].verdict: 'inconclusive' != 'confirmed'"]
    assert same_json(committed | {"one_seed": 0}, committed)  # a boolean is not a number
    assert same_json(committed | {"why": "x"}, committed) and same_json({**committed, "extra": 1}, committed)
    assert same_json([1.0, 2.0], [1.0]) == ["$: 2 items != 1"]


def test_text_numbers_within_one_unit_of_their_last_digit_pass():
    committed = "| **kerple-flat**: flat | 1.063 [0.907, 1.246] | +0.12 | 64 documents | **confirmed** |\n"
    assert same_text(committed, committed) == []
    assert same_text(committed.replace("1.246", "1.247").replace("+0.12", "+0.13"), committed) == []
    assert same_text(committed.replace("+0.12", "-0.12"), committed) == [
        "line 1: -0.12 != +0.12 (more than one unit of the last digit apart)"]
    assert same_text(committed.replace("1.246", "1.248"), committed)
    assert same_text(committed.replace("64 documents", "63 documents"), committed) == ["line 1: 63 != 64"]
    assert same_text(committed.replace("**confirmed**", "**inconclusive**"), committed)[0].startswith("line 1: ")
    assert same_text(committed + "more\n", committed) == ["2 lines != 1"]
    # digits in names and ranges are text or counts, compared exactly: T128 is not T129, 1-7 not 1-8
    assert same_text("T128 and s0, 1-7", "T129 and s0, 1-7") and same_text("1-8 %", "1-7 %") == ["line 1: 8 != 7"]
    assert same_text("-0.00 and 1.2e-4", "+0.00 and 1.3e-4") == []
