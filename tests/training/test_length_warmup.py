"""The sequence-length warm-up (train.seq_len_warmup, train.seq_len_start; lenx.training.batches):
the growth rule, steps that read the same tokens as without it (each once, in the same order), its
one-line config errors, metrics that record each step's length, and a run killed mid-warm-up that
resumes exactly as an uninterrupted one. Tiny configs on the CPU."""

import json
import os
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest

import lenx
from lenx.config import ConfigError, TrainConfig, load_config
from lenx.training import loop as train_module
from lenx.training.batches import Batches, seq_len_at
from lenx.training.distributed import DistInfo
from lenx.training.loop import train

SRC = str(Path(lenx.__file__).resolve().parents[1])
TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=32", "train.batch_size=4",
        "train.log_every=1", "train.device=cpu", "train.sampling='pass'", "train.pass_block=2"]
WARM = ["train.seq_len_start=8", "train.seq_len_warmup=5"]  # 8 for steps 0-2, 16 for 3-4, 32 from 5 on (from 0)


def stream(n=20000):
    return np.random.default_rng(3).integers(0, 1000, n).astype(np.uint16)


def test_the_lengths_double_in_equal_shares_of_the_warmup_then_stay_at_seq_len():
    t = TrainConfig(seq_len=2048, seq_len_start=512, seq_len_warmup=305, steps=3052)
    lengths = [seq_len_at(t, s) for s in range(t.steps)]
    assert lengths[:153] == [512] * 153 and lengths[153:305] == [1024] * 152 and set(lengths[305:]) == {2048}
    t = TrainConfig(seq_len=64, seq_len_start=8, seq_len_warmup=7, steps=10)  # three doublings in 7 steps
    assert [seq_len_at(t, s) for s in range(10)] == [8, 8, 8, 16, 16, 32, 32, 64, 64, 64]
    assert {seq_len_at(TrainConfig(seq_len=64), s) for s in range(5)} == {64}  # off by default


@pytest.mark.parametrize("sampling", ["pass", "random"])
def test_a_warmup_step_reads_the_same_tokens_cut_into_shorter_windows(sampling):
    tokens, T = stream(), 32
    t = TrainConfig(seq_len=T, seq_len_start=8, seq_len_warmup=6, steps=10)
    plain = Batches(tokens, T, 8, 2, 5, DistInfo(), sampling=sampling, pass_block=2)
    warm = Batches(tokens, T, 8, 2, 5, DistInfo(), sampling=sampling, pass_block=2, length=lambda s: seq_len_at(t, s))
    for step in range(8):
        L = seq_len_at(t, step)
        for micro in range(2):
            whole, cut = plain.window(step, micro), warm.window(step, micro)
            assert cut.shape == (4 * T // L, L + 1)
            pieces = cut.reshape(4, T // L, L + 1)
            # inputs and targets: every window's T predictions, each once, in order
            assert np.array_equal(pieces[:, :, :-1].reshape(4, T), whole[:, :-1])
            assert np.array_equal(pieces[:, :, 1:].reshape(4, T), whole[:, 1:])
            # two ranks take their shares of the same rows
            ranks = [Batches(tokens, T, 8, 2, 5, DistInfo(rank=r, world=2, local_rank=r), sampling=sampling,
                             pass_block=2, length=lambda s: seq_len_at(t, s)).window(step, micro) for r in range(2)]
            assert np.array_equal(np.concatenate(ranks), cut)


@pytest.mark.parametrize("sets, needle", [
    (["train.seq_len_start=12", "train.seq_len_warmup=5"], "train.seq_len_start must be train.seq_len (32) divided "
                                                           "by a power of two"),
    (["train.seq_len=96", "train.seq_len_start=32", "train.seq_len_warmup=5"], "divided by a power of two"),
    (["train.seq_len_start=32", "train.seq_len_warmup=5"], "smaller than it (16, 8, ...), got 32"),
    (["train.seq_len_warmup=5"], "train.seq_len_start must be set when train.seq_len_warmup is on"),
    (["train.seq_len_start=8"], "train.seq_len_start must be 0 while train.seq_len_warmup is 0"),
    (["train.seq_len_start=8", "train.seq_len_warmup=1"], "train.seq_len_warmup must be between 2 (one step for "
                                                          "each shorter length) and train.steps (6), got 1"),
    (["train.seq_len_start=8", "train.seq_len_warmup=7"], "and train.steps (6), got 7"),
    (["train.seq_len_start=-8", "train.seq_len_warmup=5"], "train.seq_len_start must be >= 0"),
])
def test_bad_warmup_values_are_one_line_errors_before_any_work(tmp_path, sets, needle):
    with pytest.raises(ConfigError) as e:
        load_config("tiny", TINY + ["train.steps=6", *sets])
    assert needle in str(e.value) and "\n" not in str(e.value)
    # as a user runs it: relative paths, another folder; nothing is written
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [a for o in TINY + ["train.steps=6", *sets] for a in ("--set", o)]
    out = subprocess.run([sys.executable, "-m", "lenx", "train", "-c", "tiny", *args, "-o", "runs/a", "--no-progress"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 2 and out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
    assert needle in out.stderr and not (tmp_path / "runs").exists()


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


def config(data_root, *extra):
    return load_config("tiny", TINY + [f"data.root={str(data_root)!r}", "train.steps=8", "train.ckpt_every=3",
                                       *WARM, *extra])


def test_a_run_killed_in_its_warmup_resumes_exactly(data_root, tmp_path, monkeypatch):
    ref = train(config(data_root), tmp_path / "ref", progress=False)
    assert ref["finished"]
    logged = records(tmp_path / "ref")
    assert [(r["step"], r["seq_len"]) for r in logged] == [(1, 8), (2, 8), (3, 8), (4, 16), (5, 16), (6, 32), (7, 32),
                                                           (8, 32)]
    plain = train(load_config("tiny", TINY + [f"data.root={str(data_root)!r}", "train.steps=8"]), tmp_path / "plain",
                  progress=False)
    assert plain["finished"] and "seq_len" not in records(tmp_path / "plain")[0]
    assert records(tmp_path / "plain")[0]["loss"] != logged[0]["loss"]  # the same tokens with less context

    real = train_module.run_step

    def killed_in_step_5(run, step, stop=None):  # the process dies in step 5 (a 16-token step): no checkpoint
        if step == 4:
            raise RuntimeError("killed")
        return real(run, step, stop)

    monkeypatch.setattr(train_module, "run_step", killed_in_step_5)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="killed"):
        train(config(data_root), run, progress=False)
    monkeypatch.setattr(train_module, "run_step", real)
    assert [r["step"] for r in records(run)] == [1, 2, 3, 4]  # the checkpoint of step 3, then step 4 logged
    done = train(None, run, resume=True, progress=False)
    assert done["finished"] and records(run) and [r["step"] for r in records(run)] == list(range(1, 9))
    for a, b in zip(records(run), logged):
        assert (a["seq_len"], a["loss"], a["grad_norm"]) == (b["seq_len"], b["loss"], b["grad_norm"])


def test_the_cli_trains_and_resumes_a_warmup_from_another_folder(data_root, tmp_path):
    """`lenx train --until` stops inside the warm-up, `--resume` finishes it: the curve of one run."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    sets = [a for o in TINY + ["data.root='data'", "train.steps=6", *WARM] for a in ("--set", o)]
    (tmp_path / "data").symlink_to(data_root, target_is_directory=True)

    def lenx_train(*args):
        out = subprocess.run([sys.executable, "-m", "lenx", "train", "--no-progress", *args], capture_output=True,
                             text=True, cwd=tmp_path, env=env, timeout=300)
        assert out.returncode == 0, out.stderr

    lenx_train("-c", "tiny", *sets, "-o", "runs/once")
    lenx_train("-c", "tiny", *sets, "-o", "runs/twice", "--until", "3")
    lenx_train("--resume", "runs/twice")
    once, twice = records(tmp_path / "runs" / "once"), records(tmp_path / "runs" / "twice")
    assert [r["seq_len"] for r in twice] == [8, 8, 8, 16, 16, 32]
    assert [(r["loss"], r["seq_len"]) for r in twice] == [(r["loss"], r["seq_len"]) for r in once]
