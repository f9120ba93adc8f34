"""Issue 30, "tracebacks where the README promises one line": an output path that cannot be written
(an existing file where a folder is expected or a folder where a file is, a path under a regular
file, a read-only folder) is one line on stderr, exit code 2, checked before any work starts, and
nothing is created. Every case runs `python -m lenx` as a user would, from another working
directory with relative paths."""

import os
from pathlib import Path

import pytest

from test_nothing_lost import copy_work, lenx, one_line_error, snapshot

ROOT = os.geteuid() == 0
ROOT_REASON = "running as root: a read-only folder (chmod 555) does not stop root from writing"
TINY_CPU = ["--set", "train.device=cpu", "--set", "train.steps=2"]


@pytest.fixture
def here(tmp_path) -> Path:
    """tmp/elsewhere (lenx runs from it) with a regular file `afile` and a folder `adir`."""
    here = tmp_path / "elsewhere"
    here.mkdir()
    (here / "afile").write_text("not a folder\n")
    (here / "adir").mkdir()
    return here


def unchanged(here: Path, before: dict, args, *needles):
    out = lenx(*args, cwd=here)
    line = one_line_error(out, *needles)
    assert snapshot(here) == before, "something was written"
    assert sorted(p.name for p in here.iterdir()) == ["adir", "afile"], "something was created"
    return line


CASES = [  # (args, the path named in the error)
    (["train", "-c", "tiny", *TINY_CPU, "-o", "afile"], "afile"),
    (["train", "-c", "tiny", *TINY_CPU, "-o", "afile/run"], "afile/run"),
    (["sweep", "--methods", "rope", "-c", "tiny", *TINY_CPU, "-o", "afile"], "afile"),
    (["sweep", "--methods", "rope", "-c", "tiny", *TINY_CPU, "-o", "afile/sweep"], "afile/sweep"),
    (["che", "--tasks", "parity_check", "--methods", "rope", "--steps", "2", "-o", "afile"], "afile"),
    (["che", "--tasks", "parity_check", "--methods", "rope", "--steps", "2", "-o", "afile/che"], "afile/che"),
    (["prepare", "synthetic", "--root", "afile"], "afile"),
    (["prepare", "synthetic", "--root", "afile/data"], "afile/data"),
    (["prepare", "afile", "--root", "."], "afile"),  # the corpus folder is a regular file
    (["bench", "--train-step", "--device", "cpu", "--preset", "tiny", "--methods", "rope", "-o", "adir"], "adir"),
    (["bench", "--train-step", "--device", "cpu", "--preset", "tiny", "--methods", "rope", "-o", "afile/b.json"],
     "afile/b.json"),
]


@pytest.mark.parametrize("args,needle", CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_an_unwritable_output_is_one_line_and_creates_nothing(here, args, needle):
    unchanged(here, snapshot(here), args, needle)


def test_plot_to_an_unwritable_folder_is_one_line(work, tmp_path):
    w = copy_work(work, tmp_path / "w")
    here, run = w / "elsewhere", w / "runs" / "r"
    (here / "afile").write_text("not a folder\n")
    before = snapshot(w)
    for out in ("afile", "afile/figs"):
        for args in (["plot", "../runs/r/eval.json", "-o", out], ["plot", "../runs/r", "--attention", "-o", out]):
            one_line_error(lenx(*args, cwd=here), out)
            assert snapshot(w) == before, args
    (run / "perplexity.png").mkdir()  # without -o the figure goes next to its JSON: a folder is there
    one_line_error(lenx("plot", "../runs/r/eval.json", cwd=here), "perplexity.png")


def test_eval_of_an_unwritable_run_folder_fails_before_any_work(work, tmp_path, monkeypatch, capsys):
    w = copy_work(work, tmp_path / "w")
    run = w / "runs" / "r"
    os.replace(run / "eval.json", run / "kept.json")
    (run / "eval.json").mkdir()  # a folder where the evaluation file goes
    before = snapshot(run)
    args = ["eval", "../runs/r", "--lengths", "32,64,128,256,512,1024,2048", "--windows", "64", "--device", "cpu"]
    one_line_error(lenx(*args, cwd=w / "elsewhere"), "eval.json", "folder")
    assert snapshot(run) == before, "the evaluation wrote something"
    assert not list(run.glob("eval.*.json")), "an earlier evaluation was moved"
    # the same in this process, with the evaluation itself replaced: it must never start
    from lenx.cli import main
    from lenx.evaluation import evaluate as evaluation

    def started(*a, **k):
        raise AssertionError("the evaluation started before the output was checked")

    monkeypatch.setattr(evaluation, "evaluate", started)
    monkeypatch.chdir(w / "elsewhere")
    assert main(args) == 2 and "eval.json" in capsys.readouterr().err


def test_eval_task_to_a_folder_is_one_line(work, tmp_path):
    w = copy_work(work, tmp_path / "w")
    run = w / "runs" / "r"
    (run / "eval_passkey.json").mkdir()
    before = snapshot(run)
    out = lenx("eval", "../runs/r", "--task", "passkey", "--device", "cpu", cwd=w / "elsewhere")
    one_line_error(out, "eval_passkey.json")
    assert snapshot(run) == before


@pytest.mark.skipif(ROOT, reason=ROOT_REASON)
def test_a_read_only_folder_is_one_line(work, here, tmp_path):
    ro = here / "adir"
    ro.chmod(0o555)
    try:
        before = snapshot(here)
        for args in (["train", "-c", "tiny", *TINY_CPU, "-o", "adir/run"],
                     ["che", "--tasks", "parity_check", "--methods", "rope", "--steps", "2", "-o", "adir/che"],
                     ["prepare", "synthetic", "--root", "adir"],
                     ["bench", "--train-step", "--device", "cpu", "--preset", "tiny", "--methods", "rope",
                      "-o", "adir/b.json"]):
            unchanged(here, before, args, "not writable")
        w = copy_work(work, tmp_path / "w")
        run = w / "runs" / "r"
        run.chmod(0o555)
        try:
            out = lenx("eval", "../runs/r", "--lengths", "32", "--device", "cpu", cwd=w / "elsewhere")
            one_line_error(out, "not writable")
        finally:
            run.chmod(0o755)
    finally:
        ro.chmod(0o755)


# --- "silently ignored": options that would change nothing are one-line errors -----------------------

@pytest.mark.parametrize("args,needle", [
    (["che", "--tasks", "parity_check", "--methods", "rope", "--steps", "2", "--seeds", "0,0", "-o", "che"],
     "more than once"),
    (["che", "--tasks", "parity_check", "--methods", "rope", "--steps", "2", "--seeds", "1,2,1", "-o", "che"],
     "more than once"),
], ids=["che-seeds-0,0", "che-seeds-1,2,1"])
def test_che_refuses_a_seed_named_twice(here, args, needle):
    unchanged(here, snapshot(here), args, "--seeds", needle)


@pytest.mark.parametrize("args,needles", [
    (["--rope-scaling-factor", "4"], ("--rope-scaling-factor", "not given")),
    (["--rope-scaling-factor", "auto"], ("--rope-scaling-factor", "not given")),
    (["--rope-scaling", "dynamic-ntk", "--rope-scaling-factor", "4"], ("dynamic-ntk", "does not apply")),
], ids=["factor-without-scaling", "auto-without-scaling", "factor-with-dynamic-ntk"])
def test_a_rope_scaling_factor_that_would_be_ignored_is_one_line(work, tmp_path, args, needles):
    w = copy_work(work, tmp_path / "w")
    run = w / "runs" / "r"
    before = snapshot(run)
    one_line_error(lenx("eval", "../runs/r", "--lengths", "32", "--device", "cpu", *args, cwd=w / "elsewhere"),
                   *needles)
    assert snapshot(run) == before


def test_a_folder_without_write_permission_is_refused_in_process(tmp_path, monkeypatch):
    """The read-only case as root too: os.access answering as it does for another user."""
    from lenx import fileio

    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(fileio.os, "access", lambda p, mode: False if Path(p) == ro else real(p, mode))
    for check, path in ((fileio.check_writable_dir, ro), (fileio.check_writable_dir, ro / "new" / "deeper"),
                        (fileio.check_writable_file, ro / "out.json")):
        with pytest.raises(fileio.OutputError, match="not writable"):
            check(path, "--out")
    fileio.check_writable_dir(tmp_path / "new" / "deeper", "--out")  # creatable: fine, and nothing created
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ro"]
