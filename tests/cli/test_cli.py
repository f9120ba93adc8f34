"""The CLI as users see it: help that reads in whole sentences, `lenx list`, progress bars only on a
terminal, and the options that call the library's newer keywords (sweep --seeds / --force, eval
--step, prepare --allow-missing-sources). The tables it prints: tests/report/."""

import inspect
import json
import os
from pathlib import Path
import re
import subprocess
import sys

import pytest

from helpers import eval_result
from lenx.cli import app

SRC = Path(__file__).resolve().parents[2] / "src"
COMMANDS = ("list", "prepare", "shard", "train", "eval", "generate", "export", "suite-export", "sweep", "compare", "plot", "che", "bench", "demo")


SMALL_EVAL = ["--set", "eval.max_length=128", "--set", "eval.windows=4"]


def lenx(*args, cwd=None, columns=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    if columns:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run trained through the CLI with stderr piped (no progress option given), keeping the
    weights of every step (train.keep_every=1). Returns (working directory, the train command's output)."""
    root = tmp_path_factory.mktemp("cli")
    out = lenx("train", "-c", "tiny", "--set", "train.steps=2", "--set", "train.keep_every=1", "-o", "run", cwd=root)
    assert out.returncode == 0, out.stderr
    return root, out


# --- help, list -----------------------------------------------------------------------------------

def test_command_list_has_one_sentence_per_command():
    out = lenx("--help", columns=300)
    assert out.returncode == 0, out.stderr
    panel = out.stdout.split("Commands")[1]
    rows = [line.strip("│ ") for line in panel.splitlines() if line.startswith("│")]
    assert [row.split()[0] for row in rows] == list(COMMANDS)  # no row continues on a second line
    for row in rows:
        assert row.endswith(".") and row.count(". ") == 0, row


@pytest.mark.parametrize("name", COMMANDS)
def test_command_help_paragraphs_are_not_broken(name):
    """On a wide terminal every paragraph of a command's help is one line: no line breaks of the
    docstring's source survive into the help."""
    callback = next(c.callback for c in app.registered_commands if (c.name or c.callback.__name__) == name)
    paragraphs = [" ".join(p.split()) for p in inspect.cleandoc(callback.__doc__).split("\n\n")]
    out = lenx(name, "--help", columns=400)
    assert out.returncode == 0, out.stderr
    lines = [line.strip() for line in out.stdout.splitlines()]
    for paragraph in paragraphs:
        assert paragraph in lines, (name, paragraph)


def test_list_marks_flex_forward_only_on_the_cpu():
    out = lenx("list", columns=400)
    assert out.returncode == 0, out.stderr
    rows = {cells[1]: cells for line in out.stdout.splitlines()
            if len(cells := [c.strip() for c in line.split("│")]) == 6}
    assert rows["kerple"][3] == "chunked, dense, flex (forward only)"
    assert "flex" in rows["kerple"][4] and "(forward only)" not in rows["kerple"][4]
    assert "flex" not in rows["rope"][3]
    # the fused backend's DAPE V2 kernels depend on the work: the CUDA column says how it picks
    assert "training: skewed" in rows["dapev2-kerple"][4] and "skewed" not in rows["kerple"][4]


# --- progress bars --------------------------------------------------------------------------------

def test_progress_bars_only_on_a_terminal_or_when_asked(trained):
    root, train_out = trained
    assert train_out.stderr == ""  # stderr was a pipe: no bars
    quiet = lenx("eval", "run", "--lengths", "64,128", cwd=root)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    loud = lenx("eval", "run", "--lengths", "64,128", "--progress", cwd=root)
    assert loud.returncode == 0 and "eval rope: 100%" in loud.stderr, loud.stderr


def test_demo_has_the_progress_option():
    out = lenx("demo", "--help", columns=200)
    assert "--no-progress" in out.stdout


# --- options that call the library's newer keywords -----------------------------------------------

def test_sweep_over_seeds(tmp_path):
    out = lenx("sweep", "--methods", "rope,kerple", "--seeds", "0,1", "--set", "train.steps=2", *SMALL_EVAL,
               "-o", "sw", cwd=tmp_path, columns=400)
    assert out.returncode == 0, out.stderr[-3000:]
    for run in ("rope-s0", "rope-s1", "kerple-s0", "kerple-s1"):
        assert (tmp_path / "sw" / run / "eval.json").is_file(), run
    runs = json.loads((tmp_path / "sw" / "results.json").read_text())["runs"]
    assert sorted((r["method"], r["seed"]) for r in runs) == [("kerple", 0), ("kerple", 1), ("rope", 0), ("rope", 1)]
    assert "over 2 seeds" in out.stdout and "±" in out.stdout


def test_sweep_force_trains_again(tmp_path):
    """A run trained with other settings stops a sweep; --force moves it aside and trains again."""
    args = ["sweep", "--methods", "rope", "--set", "train.steps=2", *SMALL_EVAL, "-o", "sw"]
    first = lenx(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    other = [*args, "--set", "train.lr=1e-3"]
    refused = lenx(*other, cwd=tmp_path)
    assert refused.returncode == 2 and "train.lr" in refused.stderr and "--force" in refused.stderr
    forced = lenx(*other, "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert len(list((tmp_path / "sw").glob("rope.old-*"))) == 1
    assert json.loads((tmp_path / "sw" / "rope" / "eval.json").read_text())["finished"] is True


def test_eval_a_kept_step(trained):
    root, _ = trained
    out = lenx("eval", "run", "--step", "1", "--lengths", "64,128", cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "64 (train)" in out.stdout


def test_prepare_allow_missing_sources(tmp_path):
    out = lenx("prepare", "synthetic", "--root", "data", "--allow-missing-sources", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "data" / "synthetic" / "manifest.json").is_file()


def test_new_options_are_in_the_help():
    for cmd, option in (("sweep", "--seeds"), ("sweep", "--force"), ("eval", "--step"),
                        ("prepare", "--allow-missing-sources"), ("prepare", "--no-progress"),
                        ("bench", "--backend-for")):
        out = lenx(cmd, "--help", columns=200)
        assert re.search(rf"{option}\b", out.stdout), (cmd, option)


# --- the same options with the library stubbed: what the CLI passes on ---------------------------

def invoke(*args):
    from typer.testing import CliRunner

    return CliRunner().invoke(app, list(args))


def test_sweep_passes_seeds_and_force_and_prints_mean_and_std(tmp_path, monkeypatch):
    import lenx.training.sweep

    calls = []

    def fake_sweep(methods, cfg, out_dir, progress=True, eval_kwargs=None, jobs=1, **kwargs):
        calls.append((methods, cfg.train.seed, kwargs))
        results = [eval_result(m, {64: 8.0 + s, 128: 9.0 + s}, {128: 0.1 * s}, seed=s)
                   for m in methods for s in kwargs["seeds"] or [cfg.train.seed]]
        return {"results": results, "figures": []}

    monkeypatch.setattr(lenx.training.sweep, "sweep", fake_sweep)
    monkeypatch.setenv("COLUMNS", "300")
    out = invoke("sweep", "--methods", "rope,kerple", "--seeds", "0,1,2", "--force", "-o", str(tmp_path / "sw"))
    assert out.exit_code == 0, out.output
    assert calls == [(["rope", "kerple"], 0, {"seeds": [0, 1, 2], "force": True, "memory_check": True})]
    assert "over 3 seeds" in out.output and "9.00 ± 1.00" in out.output and "(+0.10 ± 0.10)" in out.output
    calls.clear()
    assert invoke("sweep", "--methods", "rope", "-o", str(tmp_path / "one")).exit_code == 0
    assert calls == [(["rope"], 0, {"seeds": None, "force": False, "memory_check": True})]


def test_eval_passes_the_step(tmp_path, monkeypatch):
    import lenx.evaluation.evaluate
    from lenx.config import load_config, to_toml

    (tmp_path / "run").mkdir()
    # a run records an absolute data.root (a relative one must exist from the working directory)
    (tmp_path / "run" / "config.toml").write_text(to_toml(load_config("tiny", [f"data.root={str(tmp_path)!r}"])))
    seen = []

    def fake_evaluate(run_dir, lengths=None, windows=None, scored=None, device="auto", backend=None, **kwargs):
        seen.append(kwargs)
        return eval_result("rope", {64: 8.0}, {})

    monkeypatch.setattr(lenx.evaluation.evaluate, "evaluate", fake_evaluate)
    assert invoke("eval", str(tmp_path / "run"), "--step", "200", "--no-progress").exit_code == 0
    assert invoke("eval", str(tmp_path / "run"), "--no-progress").exit_code == 0
    plain = {"progress": False, "rope_scaling": None, "rope_scaling_factor": 0.0, "per_position": None}
    assert seen == [plain | {"step": 200}, plain | {"step": None}]


def test_prepare_passes_allow_missing_sources(monkeypatch):
    import lenx.data.build

    seen = []
    monkeypatch.setattr(lenx.data.build, "prepare_corpus", lambda *a, **kw: seen.append(kw) or {"name": "x"})
    assert invoke("prepare", "tech", "--allow-missing-sources").exit_code == 0
    assert invoke("prepare", "tech").exit_code == 0
    assert seen[0]["allow_missing_sources"] is True and seen[1]["allow_missing_sources"] is False
    # progress bars: off when stderr is not a terminal (as here), unless forced either way
    assert seen[1]["progress"] is False
    assert invoke("prepare", "tech", "--progress").exit_code == 0 and seen[2]["progress"] is True
    assert invoke("prepare", "tech", "--no-progress").exit_code == 0 and seen[3]["progress"] is False


def test_prepare_long_test_defaults_to_the_corpus_and_near_duplicates_are_reported(monkeypatch):
    import lenx.data.build

    seen = []
    record = {"docs_checked": 74032, "docs_dropped": 1273, "chars_dropped": 8128548, "shingle_words": 5,
              "threshold": 0.7, "num_perm": 128}
    monkeypatch.setattr(lenx.data.build, "prepare_corpus",
                        lambda *a, **kw: seen.append(kw) or {"name": "code", "near_dup": record})
    out = invoke("prepare", "code")
    assert out.exit_code == 0 and seen[0]["long_test"] is None and seen[0]["long_test_tokens"] is None
    assert ("near-duplicate documents: 1,273 of 74,032 dropped, 8,128,548 characters (Jaccard of word 5-grams "
            ">= 0.7, MinHash LSH with 128 permutations)") in out.output
    assert invoke("prepare", "code", "--long-test", "0", "--long-test-tokens", "9").exit_code == 0
    assert seen[1]["long_test"] == 0 and seen[1]["long_test_tokens"] == 9
