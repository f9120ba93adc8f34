"""The effective length of `lenx compare` (lenx.report.effective): the rule at its boundary, the
range from the intervals, the suite's exact match and log-probability, and the CLI's table and JSON."""

import json
import math

import numpy as np
import pytest

from lenx.report.effective import FRACTION, _margin, longest_within, perplexity_effective, suite_effective

BOOT = {"n": 200, "seed": 0, "level": 0.95}


def test_the_longest_length_before_the_first_that_breaks_the_rule():
    m = lambda margin, lo, hi: {"margin": margin, "lo": lo, "hi": hi}  # noqa: E731
    margins = {256: m(0.1, 0.05, 0.2), 512: m(0.05, -0.01, 0.1), 1024: m(-0.1, -0.2, 0.01), 2048: m(0.3, 0.2, 0.4)}
    # 2048 is within again, but the score broke the rule at 1024 first
    assert longest_within(128, margins) == {"length": 512, "lo": 256, "hi": 2048, "reaches_longest": False}
    margins[1024] = m(0.1, 0.0, 0.2)
    assert longest_within(128, margins) == {"length": 2048, "lo": 256, "hi": 2048, "reaches_longest": True}
    assert longest_within(128, {256: m(-1, -2, -0.5)})["length"] == 128  # the training length itself


def _runs(T=128, seeds=2):
    return [{"train_len": T, "delta_p_tokens": 128, "run": f"r{s}"} for s in range(seeds)]


def test_perplexity_within_0_85_at_the_boundary():
    """ppl(L) <= ppl(T) / 0.85: a mean NLL 0.16 above its training length's (ratio 1.174) is within,
    0.17 above (1.185) is not."""
    assert -math.log(FRACTION) == pytest.approx(0.1625, abs=1e-4)
    documents = np.arange(20)
    flat = lambda v: np.full((2, 20), v)  # noqa: E731
    stacked = {128: flat(3.0), 256: flat(3.10), 512: flat(3.16), 1024: flat(3.17), 2048: flat(3.0)}
    e = perplexity_effective(stacked, _runs(), None, documents, BOOT)
    assert e["length"] == e["lo"] == e["hi"] == 512 and not e["reaches_longest"]
    assert e["margins"]["1024"]["ratio"] == pytest.approx(math.exp(0.17)) and e["reference"] == "the scored tokens at 128"
    # noise: the range widens around the point
    rng = np.random.default_rng(0)
    noisy = {L: v + rng.normal(0, 0.3, v.shape) for L, v in stacked.items()}
    e = perplexity_effective(noisy, _runs(), None, documents, BOOT)
    assert e["lo"] <= e["length"] <= e["hi"] and e["lo"] < e["hi"]
    # in bits per byte the same ratio is per byte: -log2(0.85) bits
    bits = {L: v / math.log(2) for L, v in stacked.items()}
    assert perplexity_effective(bits, _runs(), None, documents, BOOT, unit="bpb")["length"] == 512


def test_perplexity_without_the_training_length():
    """Trained at 128, evaluated from 256: ΔP's terms (the last 128 tokens read with 128 tokens of
    input, and read at L) are the reference; without them there is none."""
    documents = np.arange(10)
    stacked = {256: np.full((1, 10), 3.0), 512: np.full((1, 10), 3.5)}
    assert "evaluate at 128" in perplexity_effective(stacked, _runs(seeds=1), None, documents, BOOT)["note"]
    terms = (np.full((1, 10), 2.9), {256: np.full((1, 10), 3.0), 512: np.full((1, 10), 3.1)}, [0])
    e = perplexity_effective(stacked, _runs(seeds=1), terms, documents, BOOT)
    assert e["length"] == 256 and e["reference"].endswith("(ΔP's terms)")  # 3.1 is 0.2 above 2.9
    assert e["margins"]["256"]["ratio"] == pytest.approx(math.exp(0.1))
    # ΔP's terms of fewer seeds than the method has are not its reference
    assert "note" in perplexity_effective({L: np.full((2, 10), 3.0) for L in (256, 512)}, _runs(seeds=2), terms,
                                          documents, BOOT)


def test_the_margin_interval():
    rng = np.random.default_rng(1)
    a, b = rng.normal(0.0, 1.0, (3, 400)), rng.normal(0.0, 1.0, (3, 400))
    r = _margin(a, b, 1.0, 0.5, 0.95)
    assert r["margin"] == pytest.approx(a.mean() - b.mean() + 0.5) and r["covers"] == "seeds and instances"
    assert 0.1 < r["hi"] - r["lo"] < 0.6  # about 2 x 1.96 x sqrt(2 / 400) = 0.28, plus the seeds' part
    one = _margin(a[:1], b[:1], FRACTION, 0.0, 0.95)
    assert one["covers"] == "instances only" and one["lo"] < one["margin"] < one["hi"]


def _suite(exact: dict, logprob: dict, cases=True, samples=4, T=128) -> dict:
    """A suite result of one task: per length, every instance scoring `exact[L]` and `logprob[L]`."""
    lengths = sorted(exact)
    r = {"exact": [[exact[L]] for L in lengths], "logprob": [[logprob[L]] for L in lengths], "chance": 0.01,
         "instances": "abc"}
    if cases:
        r["exact_cases"] = [[[1.0] * round(samples * exact[L]) + [0.0] * (samples - round(samples * exact[L]))]
                            for L in lengths]
        r["logprob_cases"] = [[[logprob[L]] * samples] for L in lengths]
    return {"task": "suite", "lengths": lengths, "depths": [0.5], "samples": samples, "seed": 1, "split": "test",
            "tasks": {"vt": r}}


def test_suite_effective_lengths(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    exact = {128: 1.0, 256: 0.9, 512: 0.5, 1024: 1.0}   # 0.9 >= 0.85 x 1.0; 0.5 is not
    logprob = {128: -1.0, 256: -1.15, 512: -1.2, 1024: -1.0}  # -0.15 >= ln 0.85 = -0.163; -0.2 is not
    (run / "eval_vt.json").write_text(json.dumps(_suite(exact, logprob, samples=20)))
    (run / "eval_vt.1234abcd.json").write_text(json.dumps(_suite(exact, logprob)))  # a kept one: not read
    out = suite_effective({"m": [{"run": str(run), "train_len": 128}]})
    assert list(out) == ["eval_vt.json"]
    e = out["eval_vt.json"]["methods"]["m"]["vt"]
    assert e["units"] == "instances"
    assert e["exact"]["length"] == 256 and e["exact"]["at_train_len"] == 1.0
    assert e["logprob"]["length"] == 256 and e["logprob"]["lo"] == e["logprob"]["hi"] == 256  # no spread at all
    # at chance at the training length: nothing to fall from
    (run / "eval_vt.json").write_text(json.dumps(_suite({128: 0.0, 256: 0.0}, {128: -3.0, 256: -3.0})))
    e = suite_effective({"m": [{"run": str(run), "train_len": 128}]})["eval_vt.json"]["methods"]["m"]["vt"]
    assert "chance" in e["exact"]["note"] and e["logprob"]["length"] == 256
    # an older file (cells only), and a training length not evaluated
    (run / "eval_vt.json").write_text(json.dumps(_suite(exact, logprob, cases=False)))
    e = suite_effective({"m": [{"run": str(run), "train_len": 128}]})["eval_vt.json"]["methods"]["m"]["vt"]
    assert e["units"].startswith("depth cells") and e["exact"]["length"] == 256
    e = suite_effective({"m": [{"run": str(run), "train_len": 128}]})["eval_vt.json"]["methods"]["m"]["vt"]
    assert e["from"] == 128
    # a grid that starts above the training length (a task longer than it) is measured from its
    # shortest length; one that ends below it has none
    e = suite_effective({"m": [{"run": str(run), "train_len": 100}]})["eval_vt.json"]["methods"]["m"]["vt"]
    assert e["from"] == 128 and e["exact"]["length"] == 256 and e["exact"]["from"] == 128
    e = suite_effective({"m": [{"run": str(run), "train_len": 2048}]})["eval_vt.json"]["methods"]["m"]["vt"]
    assert "no length from the training length 2048 up" in e["note"]


def test_compare_prints_and_writes_effective_lengths(tmp_path):
    from test_nothing_lost import lenx, ok

    from lenx.report.compare import compare_runs  # noqa: F401 (the module the CLI runs)

    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    rng = np.random.default_rng(0)
    windows = 16
    rows = {L: np.round(3.0 + (0.0 if L <= 256 else 0.5) + rng.normal(0, 0.01, windows), 6).tolist()
            for L in (128, 256, 512)}
    (run / "eval.json").write_text(json.dumps({
        "method": "m", "train_len": 128, "corpus": "c", "split": "test", "eval_seed": 1, "scored": 64,
        "lengths": [128, 256, 512], "windows": windows, "window_documents": list(range(windows)), "step": 1,
        "finished": True, "results": {str(L): {"ppl": math.exp(np.mean(v)), "window_nll": v} for L, v in rows.items()}}))
    (run / "eval_vt.json").write_text(json.dumps(_suite({128: 1.0, 256: 1.0, 512: 0.25},
                                                        {128: -1.0, 256: -1.0, 512: -2.0})))
    (tmp_path / "elsewhere").mkdir()
    out = ok(lenx("compare", "../runs/r", "-o", "c.json", "--resamples", "200", cwd=tmp_path / "elsewhere"))
    assert "effective length" in out.stdout and "eval_vt.json" in out.stdout
    result = json.loads((tmp_path / "elsewhere" / "c.json").read_text())
    assert result["methods"]["m"]["effective_length"]["length"] == 256 and "0.85" in result["effective_length_rule"]
    assert result["suite"]["eval_vt.json"]["methods"]["m"]["vt"]["exact"]["length"] == 256
    assert "per_position" not in result  # an eval.json without it


def test_run_suite_keeps_each_instances_score(tmp_path):
    """The instances' scores that the suite's intervals resample: their means are the cells."""
    from helpers import words_corpus
    from lenx.evaluation import suite

    corpus = words_corpus(tmp_path)
    rng = np.random.default_rng(0)
    r = suite.run_suite(None, corpus, ["vt"], [300, 400], [0.0, 1.0], samples=3, seed=3,
                        score=lambda m, c: (float(rng.random() < 0.5), -float(rng.random())))["tasks"]["vt"]
    assert np.asarray(r["exact_cases"]).shape == np.asarray(r["logprob_cases"]).shape == (2, 2, 3)
    assert np.allclose(np.mean(r["exact_cases"], axis=2), r["exact"])
    assert np.allclose(np.mean(r["logprob_cases"], axis=2), r["logprob"], atol=1e-6)


def test_a_malformed_suite_file_is_a_note_not_a_traceback(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    broken = _suite({128: 1.0, 256: 1.0}, {128: -1.0, 256: -1.0})
    broken["tasks"]["vt"]["exact_cases"] = [[[1.0]]]  # one length's scores for two lengths
    (run / "eval_vt.json").write_text(json.dumps(broken))
    out = suite_effective({"m": [{"run": str(run), "train_len": 128}]})
    assert "evaluate it again" in out["eval_vt.json"]["note"]
    (run / "eval_vt.json").write_text(json.dumps(broken | {"tasks": {"vt": 3}}))
    assert "evaluate it again" in suite_effective({"m": [{"run": str(run), "train_len": 128}]})["eval_vt.json"]["note"]
