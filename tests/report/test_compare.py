"""`lenx compare`: seed-mean perplexity with bootstrap intervals over documents, paired differences
between methods, and the checks that refuse runs which cannot be compared. The fake runs are made
from the structure of one real eval.json of a tiny run trained and evaluated here."""

import copy
import json
import math
import os
from pathlib import Path
import subprocess
import sys

import numpy as np
import scipy.stats
import pytest

from lenx.config import load_config, to_toml
from lenx.report.compare import CompareError, compare_runs, find_runs
from lenx.report.stats import method_difference

SRC = Path(__file__).resolve().parents[2] / "src"
TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=32", "train.batch_size=4",
        "train.steps=2", "train.log_every=1", "train.device=cpu", "eval.windows=12", "eval.scored=32"]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A tiny real run evaluated at 32 (its training length) and 64 with 32 scored tokens, so its
    ΔP window equals the scored window and ΔP can be recomputed from the window NLLs."""
    from lenx.evaluation.evaluate import evaluate
    from lenx.training.loop import train

    root = tmp_path_factory.mktemp("real")
    cfg = load_config("tiny", TINY + [f"data.root={str(root / 'data')!r}"])
    run = root / "kerple-s0"
    cfg.model.method = "kerple"
    train(cfg, run, progress=False)
    evaluate(run, lengths=[32, 64], device="cpu", progress=False)
    return run


@pytest.fixture(scope="module")
def template(real_run):
    """(eval.json, config.toml text) of the real run: what every fake run copies."""
    return json.loads((real_run / "eval.json").read_text()), (real_run / "config.toml").read_text()


def fake_run(folder: Path, template, method: str, seed: int, nll: dict, documents=None, **fields) -> Path:
    """A run folder like a real one, with the window NLLs `nll` {length: [windows]} (a number: the
    same NLL for every window); `fields` replace top-level keys of its eval.json."""
    result, config = copy.deepcopy(template[0]) | fields, template[1]
    result["method"], result["run"] = method, str(folder)
    if documents is not None:
        result["window_documents"] = list(documents)
    count = len(result["window_documents"])
    result["results"] = {}
    for L, values in nll.items():
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), (count,))
        result["results"][str(L)] = {"ppl": math.exp(values.mean()), "ppl_full": math.exp(values.mean()),
                                     "nll": float(values.mean()), "window_nll": [round(float(v), 6) for v in values]}
    result["lengths"] = sorted(int(L) for L in nll)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "eval.json").write_text(json.dumps(result))
    (folder / "config.toml").write_text(config)
    cfg = load_config(str(folder / "config.toml"))
    cfg.train.seed = seed
    (folder / "config.toml").write_text(to_toml(cfg))
    return folder


def windows_of(template) -> int:
    return len(template[0]["window_documents"])


def noisy(template, seed, shift=0.0):
    """Window NLLs that vary by window and document, shifted by `shift`."""
    docs = np.asarray(template[0]["window_documents"])
    rng = np.random.default_rng(seed)
    return 3 + shift + 0.3 * rng.standard_normal(len(docs)) + 0.2 * rng.standard_normal(docs.max() + 1)[docs]


def test_the_real_eval_json_has_what_compare_reads(real_run, template):
    result = template[0]
    assert result["delta_p_tokens"] == result["scored"] == result["train_len"] == 32
    out = compare_runs([real_run], n=200)
    m = out["methods"]["kerple"]
    assert m["seeds"] == [0] and m["delta_p_note"] is None and out["lengths"] == [32, 64]
    assert out["windows"] == windows_of(template) == 12
    assert out["documents"] == result["window_distinct_documents"]
    for L, row in result["results"].items():
        assert math.isclose(m["lengths"][L]["ppl"], row["ppl"], rel_tol=1e-5)  # window NLLs keep 6 decimals
        assert m["lengths"][L]["documents"] == out["documents"] and m["lengths"][L]["seeds"] == 1
    # ΔP recomputed from the windows is eval.json's own
    assert "delta_p" not in m["lengths"]["32"]
    assert math.isclose(m["lengths"]["64"]["delta_p"]["value"], result["results"]["64"]["delta_p"],
                        rel_tol=1e-4, abs_tol=1e-4)
    dp = m["lengths"]["64"]["delta_p"]
    assert dp["lo"] <= dp["value"] <= dp["hi"]


def test_interval_contains_the_estimate_and_collapses_on_identical_nlls(tmp_path, template):
    runs = [fake_run(tmp_path / f"a-s{s}", template, "a", s, {32: noisy(template, s), 64: noisy(template, 10 + s)})
            for s in (0, 1)]
    runs.append(fake_run(tmp_path / "flat-s0", template, "flat", 0, {32: 2.5, 64: 2.5}))
    out = compare_runs(runs, n=500)
    for e in out["methods"]["a"]["lengths"].values():
        assert e["lo"] < e["ppl"] < e["hi"] and e["seeds"] == 2
    for e in out["methods"]["flat"]["lengths"].values():
        assert math.isclose(e["lo"], math.exp(2.5)) and math.isclose(e["hi"], math.exp(2.5))
        assert math.isclose(e["ppl"], math.exp(2.5))


def test_seeds_pool_as_the_mean_of_their_perplexities(tmp_path, template):
    runs = [fake_run(tmp_path / "a-s0", template, "a", 0, {32: 2.0, 64: 2.0}),
            fake_run(tmp_path / "a-s1", template, "a", 1, {32: 3.0, 64: 2.0})]
    out = compare_runs(runs, n=200)
    e = out["methods"]["a"]["lengths"]["32"]
    assert out["methods"]["a"]["seeds"] == [0, 1]
    assert np.allclose(e["per_seed"], [math.exp(2), math.exp(3)])
    assert math.isclose(e["ppl"], (math.exp(2) + math.exp(3)) / 2)  # not exp of the mean NLL 2.5
    # every window alike: the documents add nothing, the two seeds' spread is the whole interval
    # (Student's t with 1 degree of freedom over the standard error of two mean NLLs, exponentiated)
    half = scipy.stats.t.ppf(0.975, 1) * (3 - 2) / 2
    assert math.isclose(e["lo"], math.exp(2.5 - half)) and math.isclose(e["hi"], math.exp(2.5 + half))
    assert e["covers"] == "seeds and documents"


def test_a_constant_shift_is_a_difference_that_excludes_zero(tmp_path, template):
    runs = [fake_run(tmp_path / "ref-s0", template, "ref", 0, {32: 2.0, 64: 2.0}),
            fake_run(tmp_path / "worse-s0", template, "worse", 0, {32: 2.1, 64: 2.0}),
            fake_run(tmp_path / "noisy-s0", template, "noisy", 0, {32: noisy(template, 0), 64: noisy(template, 1)}),
            fake_run(tmp_path / "noisier-s0", template, "noisier", 0,
                     {32: noisy(template, 0, shift=0.2), 64: noisy(template, 1, shift=-0.2)})]
    out = compare_runs(runs, reference="ref", n=500)
    assert set(out["differences"]) == {"worse", "noisy", "noisier"}
    shift = out["differences"]["worse"]["32"]
    assert math.isclose(shift["diff"], math.exp(2.1) - math.exp(2.0), rel_tol=1e-6)
    assert math.isclose(shift["lo"], shift["diff"], rel_tol=1e-6)
    assert math.isclose(shift["hi"], shift["diff"], rel_tol=1e-6)
    assert shift["excludes_zero"]
    same = out["differences"]["worse"]["64"]
    assert {k: same[k] for k in ("diff", "lo", "hi", "excludes_zero")} == {"diff": 0.0, "lo": 0.0, "hi": 0.0,
                                                                           "excludes_zero": False}
    assert same["covers"] == "documents only" and same["seed_sd"] is None  # one seed each
    # varying windows, all shifted alike: up at 32, down at 64, never straddling 0
    paired = compare_runs(runs, reference="noisy", n=500)["differences"]["noisier"]
    up, down = paired["32"], paired["64"]
    assert 0 < up["lo"] <= up["diff"] <= up["hi"] and up["excludes_zero"]
    assert down["lo"] <= down["diff"] <= down["hi"] < 0 and down["excludes_zero"]
    paired = method_difference(noisy(template, 0, shift=0.2), noisy(template, 0), template[0]["window_documents"],
                               n=500)
    assert math.isclose(up["diff"], paired["diff"], rel_tol=1e-5)


def test_the_bootstrap_is_seeded(tmp_path, template):
    runs = [fake_run(tmp_path / "a-s0", template, "a", 0, {32: noisy(template, 0), 64: noisy(template, 1)}),
            fake_run(tmp_path / "b-s0", template, "b", 0, {32: noisy(template, 2), 64: noisy(template, 3)})]
    one = compare_runs(runs, reference="a", n=300, seed=5)
    assert one == compare_runs(runs, reference="a", n=300, seed=5)
    other = compare_runs(runs, reference="a", n=300, seed=6)
    assert other["methods"]["b"]["lengths"]["32"]["ppl"] == one["methods"]["b"]["lengths"]["32"]["ppl"]
    assert other["methods"]["b"]["lengths"]["32"]["lo"] != one["methods"]["b"]["lengths"]["32"]["lo"]
    json.dumps(one, allow_nan=False)  # JSON-ready


def test_runs_on_other_windows_are_refused(tmp_path, template):
    base = fake_run(tmp_path / "a-s0", template, "a", 0, {32: 2.0, 64: 2.0})
    docs = list(template[0]["window_documents"])
    moved = fake_run(tmp_path / "b-s0", template, "b", 0, {32: 2.0, 64: 2.0}, documents=docs[::-1])
    short = fake_run(tmp_path / "c-s0", template, "c", 0, {32: 2.0})
    with pytest.raises(CompareError, match=r"other windows.*b-s0 \(window_documents\).*c-s0 \(lengths\)"):
        compare_runs([base, moved, short])


def test_what_cannot_be_compared_is_a_one_line_error(tmp_path, template):
    a0 = fake_run(tmp_path / "a-s0", template, "a", 0, {32: 2.0, 64: 2.0})
    twin = fake_run(tmp_path / "again" / "a-s0", template, "a", 0, {32: 2.0, 64: 2.0})
    with pytest.raises(CompareError, match="both a with training seed 0"):
        compare_runs([a0, twin])
    with pytest.raises(CompareError, match="reference method 'b' is not among the compared methods \\(a\\)"):
        compare_runs([a0], reference="b")
    other_length = fake_run(tmp_path / "a-s2", template, "a", 2, {32: 2.0, 64: 2.0}, train_len=16)
    with pytest.raises(CompareError, match="the a runs were trained at different lengths"):
        compare_runs([a0, other_length])
    with pytest.raises(CompareError, match="resamples must be an integer >= 100"):
        compare_runs([a0], n=99)
    old = fake_run(tmp_path / "old", template, "a", 1, {32: 2.0})
    result = json.loads((old / "eval.json").read_text())
    del result["results"]["32"]["window_nll"]
    (old / "eval.json").write_text(json.dumps(result))
    with pytest.raises(CompareError, match="old.*no per-window NLLs.*re-run `lenx eval"):
        compare_runs([a0, old])


def test_labels_tell_apart_runs_of_one_method(tmp_path, template):
    """Two widths of one method on the same seed are one method to eval.json: labels make them two."""
    wide = fake_run(tmp_path / "a-D64-s0", template, "a", 0, {32: 2.0, 64: 2.0})
    narrow = [fake_run(tmp_path / f"a-D10-s{s}", template, "a", s, {32: 2.2, 64: 2.1}) for s in (0, 1)]
    with pytest.raises(CompareError, match="both a with training seed 0"):
        compare_runs([wide, *narrow])
    out = compare_runs([wide, *narrow], reference="a (D=64)", n=200, labels=["a (D=64)", "a (D=10)", None])
    assert out["methods"]["a (D=10)"]["seeds"] == [0] and out["methods"]["a"]["seeds"] == [1]
    assert math.isclose(out["differences"]["a (D=10)"]["32"]["diff"], math.exp(2.2) - math.exp(2.0), rel_tol=1e-6)
    with pytest.raises(CompareError, match="2 labels for 3 runs"):
        compare_runs([wide, *narrow], labels=["x", "y"])


def test_folders_stand_for_their_runs(tmp_path, template):
    sweep = tmp_path / "sweep"
    for name in ("b-s0", "a-s1", "a-s0", "a-s0.old-20250101-000000"):
        fake_run(sweep / name, template, name.split("-")[0], int(name[3]), {32: 2.0, 64: 2.0})
    (sweep / "empty").mkdir()
    assert [p.name for p in find_runs([sweep])] == ["a-s0", "a-s1", "b-s0"]
    assert [p.name for p in find_runs([sweep / "b-s0", sweep])] == ["b-s0", "a-s0", "a-s1"]
    with pytest.raises(CompareError, match="no eval.json"):
        find_runs([sweep / "empty"])
    out = compare_runs(find_runs([sweep]))
    assert list(out["methods"]) == ["a", "b"] and out["methods"]["a"]["seeds"] == [0, 1]


def test_the_command_from_another_folder(tmp_path, template):
    sweep = tmp_path / "runs" / "sweep"
    for method, shift in (("kerple", 0.0), ("dapev2-kerple", -0.3)):
        for s in (0, 1):
            fake_run(sweep / f"{method}-s{s}", template, method, s,
                     {32: noisy(template, s, shift), 64: noisy(template, 5 + s, 2 * shift)})
    # one seed evaluated by today's lenx eval: ΔP's terms per window, so a ΔP row and an in-distribution column
    newer = sweep / "dapev2-kerple-s1" / "eval.json"
    result = json.loads(newer.read_text())
    result["in_distribution"] = {"length": 32, "tokens": 32, "window_nll": list(noisy(template, 8, 0.5))}
    result["results"]["64"]["delta_p_window_nll"] = list(noisy(template, 9))
    newer.write_text(json.dumps(result))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-m", "lenx", "compare", "../runs/sweep", "--reference", "kerple",
                          "--out", "tables/compare.json", "--resamples", "300", "--seed", "2"],
                         capture_output=True, text=True, cwd=elsewhere, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    written = json.loads((elsewhere / "tables" / "compare.json").read_text())
    expected = compare_runs([sweep / f"{m}-s{s}" for m in ("dapev2-kerple", "kerple") for s in (0, 1)],
                            reference="kerple", n=300, seed=2)
    assert written["methods"]["kerple"]["lengths"] == expected["methods"]["kerple"]["lengths"]
    assert written["differences"] == expected["differences"]
    assert written["methods"]["kerple"]["runs"] == ["../runs/sweep/kerple-s0", "../runs/sweep/kerple-s1"]
    # two seeds a method: the interval covers seeds too, and it is wider than the documents alone
    d = written["differences"]["dapev2-kerple"]["64"]
    parts = method_difference(np.stack([noisy(template, 5 + s, -0.6) for s in (0, 1)]),
                              np.stack([noisy(template, 5 + s) for s in (0, 1)]),
                              template[0]["window_documents"], n=300, seed=2)
    assert d["covers"] == "seeds and documents" and d["seed_sd"] > 0 and d["reference_seed_sd"] > 0
    assert math.isclose(d["lo"], parts["lo"], rel_tol=1e-4) and parts["var_seeds"] > 0 and d["diff"] < 0
    cell = expected["methods"]["kerple"]["lengths"]["32"]
    assert f"{cell['ppl']:.2f} [{cell['lo']:.2f}, {cell['hi']:.2f}]" in out.stdout
    assert "perplexity minus kerple's" in out.stdout and "kerple (2 seeds)" in out.stdout
    assert "wrote tables/compare.json" in out.stdout
    assert "in distribution" in out.stdout and "dapev2-kerple (seed 1)" in out.stdout  # the ΔP row's seeds


def test_delta_p_is_left_out_where_no_eval_json_keeps_its_terms(tmp_path, template):
    """Runs whose eval.json has no per-window ΔP terms (an older lenx eval) get no ΔP and no
    in-distribution point, and a note that says how to get them."""
    plain = fake_run(tmp_path / "a-s0", template, "a", 0, {32: 2.0, 64: 2.0})
    out = compare_runs([plain], n=200)
    assert "lenx eval" in out["methods"]["a"]["delta_p_note"]
    assert "in_distribution" not in out["methods"]["a"]
    assert not any("delta_p" in e for e in out["methods"]["a"]["lengths"].values())


def test_comparing_loads_no_torch():
    code = "import sys, lenx.report.compare; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_delta_p_and_the_in_distribution_point_from_their_own_window_nlls(tmp_path, real_run, template):
    """The paper's setting in small: ΔP over the last T_train = 32 tokens while 16 are scored. eval.json
    keeps ΔP's terms per window, so compare gives ΔP and the in-distribution perplexity intervals."""
    from lenx.evaluation.evaluate import evaluate

    result = evaluate(real_run, lengths=[32, 64], scored=16, device="cpu", progress=False, write=False)
    assert result["delta_p_tokens"] == 32 and result["scored"] == 16
    inside = result["in_distribution"]
    assert inside["length"] == inside["tokens"] == 32 and len(inside["window_nll"]) == windows_of(template)
    run = tmp_path / "kerple-s0"
    run.mkdir()
    (run / "eval.json").write_text(json.dumps(result))
    (run / "config.toml").write_text(template[1])
    out = compare_runs([run], n=200)
    m = out["methods"]["kerple"]
    assert m["delta_p_note"] is None
    dp = m["lengths"]["64"]["delta_p"]
    assert math.isclose(dp["value"], result["results"]["64"]["delta_p"], rel_tol=1e-4, abs_tol=1e-4)
    assert dp["lo"] <= dp["value"] <= dp["hi"]
    assert math.isclose(m["in_distribution"]["ppl"], inside["ppl"], rel_tol=1e-5)
    assert m["in_distribution"]["lo"] <= inside["ppl"] <= m["in_distribution"]["hi"]


def test_in_distribution_differences_to_the_reference(tmp_path, template):
    count = windows_of(template)

    def with_terms(folder, method, shift):
        run = fake_run(folder, template, method, 0, {32: 2.0, 64: 2.0 + shift})
        result = json.loads((run / "eval.json").read_text())
        result["in_distribution"] = {"length": 32, "tokens": 32, "window_nll": [2.5 + shift] * count}
        result["results"]["64"]["delta_p_window_nll"] = [2.4 + shift] * count
        (run / "eval.json").write_text(json.dumps(result))
        return run

    out = compare_runs([with_terms(tmp_path / "a-s0", "a", 0.0), with_terms(tmp_path / "b-s0", "b", 0.1)],
                       reference="a", n=200)
    b = out["methods"]["b"]
    assert math.isclose(b["in_distribution"]["ppl"], math.exp(2.6), rel_tol=1e-9)
    assert math.isclose(b["lengths"]["64"]["delta_p"]["value"], math.exp(2.6) - math.exp(2.5), rel_tol=1e-9)
    d = out["differences"]["b"]["in_distribution"]
    assert math.isclose(d["diff"], math.exp(2.6) - math.exp(2.5), rel_tol=1e-9) and d["excludes_zero"]
    # a seed without the terms leaves them to the seeds that have them
    plain = fake_run(tmp_path / "b-s1", template, "b", 1, {32: 2.0, 64: 2.1})
    out = compare_runs([with_terms(tmp_path / "a-s0", "a", 0.0), with_terms(tmp_path / "b-s0", "b", 0.1), plain],
                       reference="a", n=200)
    assert out["methods"]["b"]["in_distribution"]["seeds"] == [0]
    assert math.isclose(out["differences"]["b"]["in_distribution"]["diff"], d["diff"], rel_tol=1e-9)


def test_delta_p_from_the_seeds_that_keep_its_terms(tmp_path, template):
    """A method whose older seed's eval.json predates per-window ΔP terms gets ΔP and the
    in-distribution point from the seeds that have them, and says which."""
    count = windows_of(template)
    new = fake_run(tmp_path / "a-s1", template, "a", 1, {32: 2.0, 64: 2.1})
    result = json.loads((new / "eval.json").read_text())
    result["in_distribution"] = {"length": 32, "tokens": 32, "window_nll": [2.5] * count}
    result["results"]["64"]["delta_p_window_nll"] = [2.4] * count
    (new / "eval.json").write_text(json.dumps(result))
    old = fake_run(tmp_path / "a-s0", template, "a", 0, {32: 2.0, 64: 2.2}, delta_p_tokens=16)
    old_result = json.loads((old / "eval.json").read_text())
    del old_result["in_distribution"]
    (old / "eval.json").write_text(json.dumps(old_result))
    m = compare_runs([old, new], n=200)["methods"]["a"]
    assert m["delta_p_seeds"] == [1] and m["in_distribution"]["seeds"] == [1]
    assert math.isclose(m["lengths"]["64"]["delta_p"]["value"], math.exp(2.5) - math.exp(2.4), rel_tol=1e-9)
    assert m["lengths"]["64"]["seeds"] == 2


def test_windows_above_uniform_guessing_are_flagged(tmp_path, template):
    """A window whose mean NLL is above ln(vocabulary) (the run's meta.json) is counted per method
    and length with its document, and the command warns; runs without meta.json are not checked."""
    docs = template[0]["window_documents"]
    nll = np.full(len(docs), 2.0)
    nll[3] = 9.9  # above ln 16384 = 9.70
    run = fake_run(tmp_path / "runs" / "a-s0", template, "a", 0, {32: nll, 64: 2.0})
    (run / "meta.json").write_text(json.dumps({"vocab_size": 16384}))
    entry = compare_runs([run], n=200)["methods"]["a"]["lengths"]
    assert entry["32"]["above_uniform_windows"] == 1 and entry["32"]["above_uniform_documents"] == [docs[3]]
    assert entry["64"]["above_uniform_windows"] == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-m", "lenx", "compare", "runs", "--out", "c.json", "--resamples", "200"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "above ln(vocabulary)" in out.stdout and str(docs[3]) in out.stdout
    (run / "meta.json").unlink()
    assert "above_uniform_windows" not in compare_runs([run], n=200)["methods"]["a"]["lengths"]["32"]


def test_other_tokenizers_are_compared_in_bits_per_byte(tmp_path, template):
    """An HF model with a tokenizer of its own (lenx eval --hf) beside a lenx run: every figure turns to
    bits per byte of the scored text, from each window's NLL, tokens and bytes; ΔP likewise."""
    windows = windows_of(template)
    rng = np.random.default_rng(3)
    size = (200 + rng.integers(0, 50, windows)).tolist()  # bytes of each window's scored tokens
    lenx_run = fake_run(tmp_path / "rope-s0", template, "rope", 0, {32: noisy(template, 0), 64: noisy(template, 1)},
                        window_bytes={"scored": size, "delta_p": size})
    tokens = (40 + rng.integers(0, 10, windows)).tolist()
    hf = fake_run(tmp_path / "hf", template, "llama", 0, {32: noisy(template, 2), 64: noisy(template, 3)},
                  window_bytes={"scored": size, "delta_p": size}, window_tokens={"scored": tokens, "delta_p": tokens},
                  tokenizer={"class": "GPT2TokenizerFast", "sha256": "ab" * 32, "same_as_corpus": False})
    out = compare_runs([lenx_run, hf], reference="rope", n=200)
    assert out["unit"] == "bpb" and out["tokenizers"] == ["GPT2TokenizerFast abababab", "corpus"]
    scored = template[0]["scored"]
    for name, run, per_window in (("rope", lenx_run, scored), ("llama", hf, np.array(tokens))):
        nll = json.loads((run / "eval.json").read_text())["results"]["64"]["window_nll"]
        bits = np.asarray(nll) * per_window / np.asarray(size) / math.log(2)
        entry = out["methods"][name]["lengths"]["64"]
        assert "ppl" not in entry and math.isclose(entry["bpb"], bits.mean(), rel_tol=1e-9)
        assert entry["lo"] <= entry["bpb"] <= entry["hi"]
    diff = out["differences"]["llama"]["64"]
    assert math.isclose(diff["diff"], out["methods"]["llama"]["lengths"]["64"]["bpb"] -
                        out["methods"]["rope"]["lengths"]["64"]["bpb"], rel_tol=1e-9)
    # the same tokenizer (an HF model that reads the corpus's ids) stays per token
    same = fake_run(tmp_path / "same", template, "same", 0, {32: 2.0, 64: 2.0},
                    tokenizer={"class": "X", "sha256": "cd" * 32, "same_as_corpus": True})
    assert compare_runs([lenx_run, same], n=200)["unit"] == "ppl"
    # per byte needs every run's bytes: an eval.json from before they were recorded is named
    old = fake_run(tmp_path / "old-s0", template, "old", 0, {32: 2.0, 64: 2.0})
    with pytest.raises(CompareError, match="old-s0/eval.json records no bytes per window"):
        compare_runs([old, hf], n=200)


def test_nan_window_nlls_are_a_one_line_error(tmp_path, template):
    """A NaN window NLL (a broken evaluation) stops compare with a message that names the run and length."""
    bad = noisy(template, 0)
    bad[2] = float("nan")
    broken = fake_run(tmp_path / "a-s0", template, "a", 0, {32: bad, 64: 2.0})
    with pytest.raises(CompareError, match="NaN or infinite window NLLs at length 32"):
        compare_runs([broken], n=200)


def hf_result(folder: Path, template, method: str, nll: dict) -> Path:
    """A `lenx eval --hf` output folder (eval.json of kind hf, no config.toml) on the template's windows."""
    fake_run(folder, template, method, 0, nll, kind="hf")
    (folder / "config.toml").unlink()
    return folder


def test_hf_results_are_kept_apart_from_run_seeds(tmp_path, template):
    """An export evaluated with --hf and named after its method (exp/rope -> "rope") is not one more
    seed of the run it came from: it is the method "rope (hf: FOLDER)"; another name stays as it is."""
    run = fake_run(tmp_path / "runs" / "rope", template, "rope", 0, {32: noisy(template, 0), 64: noisy(template, 1)})
    kerple = fake_run(tmp_path / "runs" / "kerple", template, "kerple", 0, {32: 2.0, 64: 2.0})
    export = hf_result(tmp_path / "hf" / "exp-rope", template, "rope", {32: noisy(template, 0), 64: noisy(template, 1)})
    llama = hf_result(tmp_path / "hf" / "llama", template, "llama", {32: 2.5, 64: 2.5})
    out = compare_runs([run, kerple, export, llama], reference="rope", n=200)
    hf_name = f"rope (hf: {export})"
    assert list(out["methods"]) == ["rope", "kerple", hf_name, "llama"]
    assert out["methods"]["rope"]["seeds"] == [0] and out["methods"]["rope"]["runs"] == [str(run)]
    assert out["methods"][hf_name]["runs"] == [str(export)]
    assert out["differences"][hf_name]["32"]["diff"] == pytest.approx(0, abs=1e-9)  # the run's own numbers
    assert [r["method"] for r in out["runs"]] == ["rope", "kerple", hf_name, "llama"]
    # two --hf results of one name are two methods too
    again = hf_result(tmp_path / "hf" / "exp-rope-2", template, "rope", {32: 2.0, 64: 2.0})
    assert list(compare_runs([export, again], n=200)["methods"]) == [f"rope (hf: {export})", f"rope (hf: {again})"]


def test_another_version_of_the_corpus_is_named_before_the_windows(tmp_path, template):
    """Runs evaluated on a corpus prepared anew have other windows too: the error names the corpus."""
    first = fake_run(tmp_path / "a-s0", template, "a", 0, {32: 2.0, 64: 2.0})
    docs = list(template[0]["window_documents"])
    fingerprint = dict(template[0]["corpus_fingerprint"], test="0" * 64)
    anew = fake_run(tmp_path / "b-s0", template, "b", 0, {32: 2.0}, documents=docs[::-1],
                    corpus_fingerprint=fingerprint)
    with pytest.raises(CompareError) as e:
        compare_runs([first, anew])
    corpus = template[0]["corpus"]
    assert str(e.value).startswith(f"runs evaluated on another version of corpus {corpus!r} than {first}: {anew} ")
    assert "window_documents" not in str(e.value) and "prepared anew" in str(e.value)


def lenx(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def test_run_again_it_shows_the_table_and_keeps_the_earlier_comparison(tmp_path, template):
    fake_run(tmp_path / "runs" / "a-s0", template, "a", 0, {32: 2.0, 64: 2.0})
    first = lenx("compare", "runs", "--resamples", "100", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    kept = (tmp_path / "compare.json").read_bytes()
    again = lenx("compare", "runs", "--resamples", "100", "--seed", "1", cwd=tmp_path)
    assert again.returncode == 2 and "perplexity of the last" in again.stdout and "wrote" not in again.stdout
    assert again.stderr.splitlines() == ["error: compare.json holds an earlier comparison; pass --force to replace it, "
                                         "or --out FILE to write this one elsewhere (the table above was not saved)"]
    assert (tmp_path / "compare.json").read_bytes() == kept


def test_an_out_that_cannot_be_written_is_one_line(tmp_path, template, monkeypatch):
    """Checked before any work where the path shows it (a file in the way); where only the write does
    (a folder root may not write: chattr +i), the same words as the other tools', not a raw OSError."""
    import errno

    from lenx.report import compare

    run = fake_run(tmp_path / "runs" / "a-s0", template, "a", 0, {32: 2.0, 64: 2.0})
    (tmp_path / "afile").write_text("mine\n")
    out = lenx("compare", "runs", "-o", "afile/c.json", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.splitlines() == [
        "error: cannot write --out afile/c.json: afile is a file, not a folder"]

    def denied(path, obj):
        raise PermissionError(errno.EPERM, "Operation not permitted", f"ro/.c.json.tmp-{os.getpid()}")

    monkeypatch.setattr(compare, "write_json", denied)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CompareError) as e:
        compare.compare_to_file([run], Path("ro") / "c.json", named=True, force=False, n=100)
    assert str(e.value) == "cannot write --out ro/c.json: ro is not writable (permission denied)"
