"""Bad input through the real CLI, as a user runs it: every case exits non-zero with exactly one
line on stderr that starts with "error:", no traceback, and changes no file."""

import json
import os
from pathlib import Path
import subprocess
import sys

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def lenx(*args, cwd):
    # this checkout's lenx, whatever the working directory (a relative PYTHONPATH would not follow it)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


def snapshot(root: Path) -> dict:
    """Every file and folder under root: name -> (modification time, size)."""
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")}


def fake_eval(folder: Path, method: str, documents: list[int], per_window: bool = True) -> None:
    """An eval.json as `lenx eval` writes it (the keys `lenx compare` reads), with made-up NLLs;
    per_window=False: as an older lenx wrote it, without window NLLs."""
    results = {}
    for L in (64, 128):
        row = {"ppl": 10.0, "ppl_full": 10.0, "nll": 2.302585}
        if per_window:
            row["window_nll"] = [2.3 + 0.01 * i for i in range(len(documents))]
        results[str(L)] = row
    folder.mkdir(parents=True)
    (folder / "eval.json").write_text(json.dumps({
        "run": str(folder), "method": method, "train_len": 64, "corpus": "synthetic", "step": 2, "steps": 2,
        "finished": True, "lengths": [64, 128], "windows": len(documents), "scored": 32, "split": "test",
        "eval_seed": 1234, "window_documents": documents, "window_distinct_documents": len(set(documents)),
        "delta_p_tokens": 32, "results": results}))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A working directory with a trained tiny run (run/), its corpus (data/), a TOML file that does
    not parse (bad.toml), a folder that is not a run (notarun/), and evaluated runs for `lenx
    compare`: cmp/ (two methods on the same windows), cmp-other/ (other windows), cmp-old/ (an
    eval.json without window NLLs)."""
    root = tmp_path_factory.mktemp("cli")
    out = lenx("train", "-c", "tiny", "--set", "train.steps=2", "-o", "run", "--no-progress", cwd=root)
    assert out.returncode == 0, out.stderr
    (root / "bad.toml").write_text("[train]\nsteps = = 3\n")
    (root / "notarun").mkdir()
    (root / "notarun" / "notes.txt").write_text("not a run\n")
    fake_eval(root / "cmp" / "kerple-s0", "kerple", [0, 1, 2, 3])
    fake_eval(root / "cmp" / "rope-s0", "rope", [0, 1, 2, 3])
    fake_eval(root / "cmp-other" / "alibi-s0", "alibi", [4, 5, 6, 7])
    fake_eval(root / "cmp-old" / "alibi-s0", "alibi", [0, 1, 2, 3], per_window=False)
    return root


DAPE = ["--set", "model.method=dapev2-kerple"]
CASES = [
    # the model cannot be built
    pytest.param(["train", *DAPE, "--set", "model.dape_kernel=4"], "model.dape_kernel", id="dape_kernel-even"),
    pytest.param(["train", *DAPE, "--set", "model.dape_kernel=0"], "model.dape_kernel", id="dape_kernel-zero"),
    pytest.param(["train", "--set", "model.n_head=3"], "divisible", id="d_model-not-divisible"),
    pytest.param(["train", "--set", "model.n_head=0"], "model.n_head", id="n_head-zero"),
    pytest.param(["train", "--set", "model.n_layer=0"], "model.n_layer", id="n_layer-zero"),
    pytest.param(["train", *DAPE, "--set", "model.backend=triton", "--set", "train.device=cpu"], "Usable here",
                 id="triton-on-cpu"),
    pytest.param(["train", "--set", "model.method=kerple", "--set", "model.backend=flex", "--set", "train.device=cpu"],
                 "cannot train on cpu", id="flex-training-on-cpu"),
    pytest.param(["train", "--set", "model.activation=swish"], "model.activation", id="activation"),
    pytest.param(["train", "--set", "model.method=stickbreaking", "--set", "model.sb_remainder=nowhere"],
                 "model.sb_remainder", id="sb_remainder"),
    pytest.param(["train", "--set", "model.causal=false"], "model.causal", id="non-causal-lm"),
    # training settings
    pytest.param(["train", "--set", "train.lr=-1"], "train.lr", id="negative-lr"),
    pytest.param(["train", "--set", "train.device=tpu"], "train.device", id="train-device-tpu"),
    pytest.param(["demo", "--steps", "0"], "--steps must be >= 1", id="demo-zero-steps"),
    # names, keys and values
    pytest.param(["train", "--set", "model.method=kerpel"], "Did you mean kerple", id="unknown-method"),
    pytest.param(["train", "--set", "train.stpes=1"], "did you mean train.steps", id="unknown-key"),
    pytest.param(["train", "--set", "train.steps=[1,"], "train.steps must be an integer", id="bad-toml-value"),
    pytest.param(["train", "-c", "bad.toml"], "not valid TOML", id="bad-toml-file"),
    # --resume continues a run as it was saved: options it would ignore are errors
    pytest.param(["train", "--resume", "run", "--set", "train.steps=4"], "--set cannot change it", id="resume-set"),
    pytest.param(["train", "--resume", "run", "-c", "tiny"], "-c/--config cannot replace it", id="resume-config"),
    pytest.param(["train", "--resume", "run", "--config", "bad.toml"], "-c/--config cannot replace it",
                 id="resume-config-long"),
    pytest.param(["train", "--resume", "run", "-o", "elsewhere"], "-o/--out cannot move it", id="resume-out"),
    # a sweep checks every method's config before the first one trains
    pytest.param(["sweep", "--methods", "rope,dapev2-kerple", "--set", "model.dape_kernel=4"], "model.dape_kernel",
                 id="sweep-bad-second-method"),
    pytest.param(["sweep", "--methods", "rope,kerpel"], "Did you mean kerple", id="sweep-unknown-method"),
    pytest.param(["sweep", "--methods", "rope,rope"], "more than once", id="sweep-method-twice"),
    pytest.param(["sweep", "--methods", "rope", "--set", "eval.max_length=32"], "no evaluation length",
                 id="sweep-nothing-to-evaluate"),
    pytest.param(["sweep", "--methods", "rope", "--seeds", "0,x"], "--seeds", id="sweep-bad-seeds"),
    # a step too large for the machine's memory (hundreds of GB), refused before anything trains
    pytest.param(["train", "--set", "train.seq_len=100000", "--set", "train.batch_size=512"], "--no-memory-check",
                 id="train-step-too-large"),
    pytest.param(["sweep", "--methods", "rope,alibi", "--set", "train.seq_len=100000", "--set", "train.batch_size=512",
                  "--set", "eval.max_length=200000"], "rope: training at train.seq_len=100000", id="sweep-step-too-large"),
    pytest.param(["che", "--methods", "dapev2-kerple", "--tasks", "parity_check", "--test-max-length", "100000"],
                 "--test-max-length 100000 would test", id="che-test-too-large"),
    # the data a run reads (the corpus here is the synthetic one, unsharded)
    pytest.param(["train", "--set", "train.sampling=once"], "train.sampling must be one of random, pass",
                 id="train-sampling-unknown"),
    pytest.param(["train", "--set", "train.sampling='pass'", "--set", "train.steps=100000"],
                 "fewer than train.steps 100,000", id="train-pass-too-short"),
    pytest.param(["train", "--until", "0"], "--until", id="train-until-zero"),
    pytest.param(["shard", "synthetic", "--size", "0"], "--size '0' holds no token", id="shard-size-zero"),
    pytest.param(["shard", "synthetic", "--size", "lots"], "--size must be tokens", id="shard-size-words"),
    pytest.param(["shard", "synthetic", "--join"], "is not sharded", id="shard-join-unsharded"),
    pytest.param(["shard", "synthetic", "--check"], "is not sharded", id="shard-check-unsharded"),
    pytest.param(["shard", "synthetic", "--join", "--size", "10K"], "--join writes train.bin back",
                 id="shard-join-with-size"),
    pytest.param(["shard", "synthetc"], "did you mean 'synthetic'", id="shard-unknown-corpus"),
    # evaluation
    pytest.param(["eval", "notarun"], "not a lenx run", id="eval-not-a-run"),
    pytest.param(["eval", "run", "--device", "tpu"], "--device", id="eval-device-tpu"),
    pytest.param(["eval", "run", "--device", "cuda:99"], "--device", id="eval-device-missing-gpu"),
    pytest.param(["eval", "run", "--backend", "bogus"], "model.backend", id="eval-unknown-backend"),
    pytest.param(["eval", "run", "--windows", "-1"], "windows", id="eval-windows-negative"),
    pytest.param(["eval", "run", "--windows", "0"], "windows", id="eval-windows-zero"),
    pytest.param(["eval", "run", "--scored", "-5"], "scored", id="eval-scored-negative"),
    pytest.param(["eval", "run", "--scored", "0"], "scored", id="eval-scored-zero"),
    # plots, CHE, bench
    pytest.param(["plot", "run", "--attention", "--layer", "7"], "--layer 7", id="plot-layer-out-of-range"),
    pytest.param(["plot", "run", "--attention", "--head", "4"], "--head 4", id="plot-head-out-of-range"),
    pytest.param(["plot", "notarun"], "nothing to draw", id="plot-nothing"),
    pytest.param(["plot", "run", "--attention", "--length", "100000"], "would write about 110.0 GB of JSON",
                 id="plot-attention-too-long"),
    pytest.param(["che", "--preset", "huge"], "preset", id="che-unknown-preset"),
    pytest.param(["che", "--tasks", "parity_chek"], "parity_check", id="che-unknown-task"),
    pytest.param(["bench", "--device", "tpu"], "--device", id="bench-device-tpu"),
    # typer's own parsing
    pytest.param(["eval", "run", "--windows", "abc"], "--windows", id="typer-bad-int"),
    pytest.param(["generate"], "Missing argument", id="typer-missing-argument"),
    pytest.param(["eval"], "give a run directory to evaluate", id="eval-nothing-to-evaluate"),
    pytest.param(["train", "--stesp", "3"], "--stesp", id="typer-unknown-option"),
    pytest.param(["evaluate", "run"], "evaluate", id="typer-unknown-command"),
]


def check_bad_input(workdir, args, needle):
    before = snapshot(workdir)
    out = lenx(*args, cwd=workdir)
    lines = out.stderr.splitlines()
    assert out.returncode != 0, out.stdout[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error:"), out.stderr[-3000:]
    assert needle in lines[0], lines[0]
    assert snapshot(workdir) == before, "the failed command changed files"
    return out


@pytest.mark.parametrize("args, needle", CASES)
def test_bad_input_is_one_line_and_changes_nothing(workdir, args, needle):
    check_bad_input(workdir, args, needle)


def test_resuming_a_finished_run_says_so_and_changes_nothing(workdir):
    before = snapshot(workdir)
    out = lenx("train", "--resume", "run", "--no-progress", cwd=workdir)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.splitlines() == ["run has already finished training (step 2 of 2): nothing to resume"]
    assert json.loads(out.stdout)["finished"] is True
    assert snapshot(workdir) == before  # meta.json records no resume, metrics and TensorBoard stay as they were
    assert "resumes" not in json.loads((workdir / "run" / "meta.json").read_text())


TEXTS = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "texts"  # 9 short documents
PREPARE_CASES = [
    pytest.param(["--long-test", "-1"], "--long-test must be an integer >= 0, got -1", id="long-test-negative"),
    pytest.param(["--long-test", "abc"], "--long-test", id="long-test-not-a-number"),
    pytest.param(["--long-test", "2.5"], "--long-test", id="long-test-not-an-integer"),
    pytest.param(["--long-test", "1", "--long-test-tokens", "0"], "--long-test-tokens must be an integer >= 1",
                 id="long-test-tokens-zero"),
    pytest.param(["--long-test", "5"], "has at most 0", id="long-test-too-few-long-documents"),
    pytest.param(["--long-test", "20", "--long-test-tokens", "1"], "needs at least 22",
                 id="long-test-too-few-documents"),
]


@pytest.mark.parametrize("args, needle", PREPARE_CASES)
def test_bad_long_test_is_one_line_exit_2_and_changes_nothing(workdir, args, needle):
    out = check_bad_input(workdir, ["prepare", "mine", "--from", str(TEXTS), *args], needle)
    assert out.returncode == 2
    assert not (workdir / "data" / "mine").exists()


def test_long_test_of_the_synthetic_corpus(workdir):
    out = check_bad_input(workdir, ["prepare", "synthetic", "--long-test", "3"], "applies to text corpora")
    assert out.returncode == 2


COMPARE_CASES = [
    pytest.param(["notarun"], "no eval.json", id="compare-no-runs"),
    pytest.param(["nowhere"], "not a folder", id="compare-missing-folder"),
    pytest.param(["cmp", "cmp-other"], "cmp-other/alibi-s0 (window_documents)", id="compare-other-windows"),
    pytest.param(["cmp", "--reference", "kerpel"], "reference method 'kerpel'", id="compare-unknown-reference"),
    pytest.param(["cmp-old"], "re-run `lenx eval", id="compare-no-window-nll"),
    pytest.param(["cmp", "--resamples", "50"], "--resamples must be at least 100", id="compare-few-resamples"),
    pytest.param(["cmp", "--seed", "-1"], "--seed must be", id="compare-negative-seed"),
]


@pytest.mark.parametrize("args, needle", COMPARE_CASES)
def test_bad_compare_is_one_line_exit_2_and_writes_nothing(workdir, args, needle):
    out = check_bad_input(workdir, ["compare", *args, "--out", "compare.json"], needle)
    assert out.returncode == 2
    assert not (workdir / "compare.json").exists()


def test_code_corpus_without_datasketch_is_one_line_before_any_download(tmp_path):
    """`lenx prepare code` where datasketch is not installed (an import of it fails)."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "datasketch.py").write_text("raise ImportError('No module named datasketch')\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), str(SRC), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "lenx", "prepare", "code", "--root", "data"], capture_output=True,
                         text=True, timeout=600, cwd=work, env=env)
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines == ["error: removing near-duplicate documents needs the `datasketch` package; run "
                     "`pip install 'lenx[dedup]'`"]
    assert not (work / "data" / ".cache").exists() and not (work / "data" / "code").exists()
