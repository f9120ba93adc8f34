"""Export, then measure: `lenx eval` on a run and `lenx eval --hf` on its export, at the same lengths
and windows, give the same numbers (fp32), for the method families whose rows differ most in how
they are read (RoPE, Kerple, T5's bias table, DAPE V2's key halo, stick-breaking), in the library
and through the CLI as a user runs it."""

import json
import math
import os
from pathlib import Path

import pytest

from conftest import TINY
from test_export_run import lenx

pytest.importorskip("transformers")

FAMILIES = ["rope", "kerple", "t5", "dapev2-kerple", "stickbreaking"]
SETTINGS = dict(lengths=[32, 64], windows=4, scored=16, device="cpu", progress=False)
KEYS = ("ppl", "ppl_full", "nll", "bpb", "delta_p")  # what both evaluations give per length


def same_numbers(mine: dict, theirs: dict) -> None:
    """Every number that a run's evaluation and an HF model's have in common, to fp32 rounding."""
    assert mine["lengths"] == theirs["lengths"] and mine["window_documents"] == theirs["window_documents"]
    for L, row in mine["results"].items():
        other = theirs["results"][L]
        for key in KEYS:
            assert (key in row) == (key in other), (L, key)
            if key in row:
                assert math.isclose(row[key], other[key], rel_tol=1e-5, abs_tol=1e-5), (L, key, row[key], other[key])
        for key in ("window_nll", "delta_p_window_nll"):
            assert len(row.get(key, [])) == len(other.get(key, []))
            for a, b in zip(row.get(key, []), other.get(key, [])):
                assert math.isclose(a, b, abs_tol=2e-5), (L, key, a, b)
    assert math.isclose(mine["in_distribution"]["ppl"], theirs["in_distribution"]["ppl"], rel_tol=1e-5)


def train_run(method: str, words_root: Path, out: Path) -> Path:
    from lenx.config import load_config
    from lenx.training.loop import train

    train(load_config("tiny", TINY + [f"data.root={str(words_root)!r}", f"model.method={method!r}"]), out,
          progress=False)
    return out


@pytest.mark.parametrize("method", FAMILIES)
def test_an_export_measures_as_its_run(method, words_root, tmp_path):
    """The export reads each window with lenx's own model: no trust_remote_code, no position table
    taken for T5's bias table, and DAPE V2's last scored row not read beside a token after it."""
    from lenx.evaluation.evaluate import evaluate
    from lenx.evaluation.hf_eval import evaluate_hf
    from lenx.export.folder import export_run

    run = train_run(method, words_root, tmp_path / "run")
    export_run(run, tmp_path / "exported")
    mine = evaluate(run, write=False, **SETTINGS)
    theirs = evaluate_hf(tmp_path / "exported", like=run, write=False, **SETTINGS)
    assert theirs["tokenizer"]["same_as_corpus"] and theirs["hf_config"]["model_type"] == "lenx"
    same_numbers(mine, theirs)


def test_the_cli_measures_an_export_as_its_run(run, tmp_path):
    """lenx export, lenx eval RUN and lenx eval --hf DIR --like RUN from another folder, with relative
    paths: the two eval.json files hold the same numbers."""
    import shutil

    where = tmp_path / "elsewhere"
    where.mkdir()
    mine = shutil.copytree(run, tmp_path / "run")  # the session's run stays without an eval.json
    rel = os.path.relpath(mine, where)
    for args in (("export", rel, "models/rope"),
                 ("eval", rel, "--lengths", "32,64", "--windows", "4", "--scored", "16", "--device", "cpu",
                  "--no-progress"),
                 ("eval", "--hf", "models/rope", "--like", rel, "--out", "evals/rope", "--device", "cpu",
                  "--no-progress")):
        out = lenx(*args, cwd=where)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "wrote evals/rope/eval.json" in out.stdout, out.stdout
    same_numbers(json.loads((mine / "eval.json").read_text()),
                 json.loads((where / "evals" / "rope" / "eval.json").read_text()))
    # the README's flow goes on with lenx compare: the export is not a second seed of the run's method
    out = lenx("compare", rel, "evals", "--reference", "rope", "--resamples", "100", "-o", "c.json", cwd=where)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((where / "c.json").read_text())
    assert list(report["methods"]) == ["rope", "rope (hf: evals/rope)"]
    assert report["methods"]["rope"]["seeds"] == [0] and report["methods"]["rope"]["runs"] == [rel]
    assert "rope (1 seed)" in out.stdout and "rope (2 seeds)" not in out.stdout
    assert abs(report["differences"]["rope (hf: evals/rope)"]["32"]["diff"]) < 1e-3  # the run's own numbers
