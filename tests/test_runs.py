"""Run directories under damage and reuse: missing checkpoint state, torn metrics, stale sweeps and
evaluations, bad evaluation options, runs opened from another folder, interrupts, resumes, validation
loss and kept checkpoints. Tiny configs on the CPU."""

import json
import math
import os
import re
from pathlib import Path
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import lenx
from lenx.config import ConfigError, load_config, to_toml
from lenx.evaluation.evaluate import evaluate, evaluate_task
from lenx.model.checkpoint import CheckpointError, checkpoint_dir
from lenx.training import loop as train_module
from lenx.training.loop import train
from lenx.training.sweep import SweepError, sweep

TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=32", "train.batch_size=4",
        "eval.max_length=64", "eval.windows=2", "eval.scored=16", "train.log_every=1", "train.device=cpu"]
SRC = str(Path(lenx.__file__).resolve().parents[1])  # subprocesses run the lenx this test imports


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


def overrides(data_root, *extra):
    return TINY + [f"data.root={str(data_root)!r}", *extra]


def tiny(data_root, *extra, **train_keys):
    """The tiny config; train_keys: train.* keys that lenx.config may not declare yet."""
    cfg = load_config("tiny", overrides(data_root, *extra))
    for key, value in train_keys.items():
        setattr(cfg.train, key, value)
    return cfg


def sets(items):
    return [a for o in items for a in ("--set", o)]


def run_cli(*args, cwd=None, timeout=300):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env)


def records(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def ckpt_step(run_dir):
    return torch.load(checkpoint_dir(run_dir) / "state.pt", weights_only=False)["step"]


def with_train_keys(monkeypatch, **keys):
    """Set train.* keys that lenx.config may not declare yet on every run config loaded, so a
    resumed run keeps them too."""
    from lenx import runs

    real = runs.load_config

    def load(*args, **kwargs):
        cfg = real(*args, **kwargs)
        for key, value in keys.items():
            setattr(cfg.train, key, value)
        return cfg

    monkeypatch.setattr(runs, "load_config", load)


# --- a damaged checkpoint is reported, never trained over ------------------------------------------

def test_missing_or_unreadable_state_is_damage_not_a_fresh_start(data_root, tmp_path):
    run = tmp_path / "run"
    train(tiny(data_root, "train.steps=4", "train.ckpt_every=2"), run, progress=False)
    weights = (run / "ckpt" / "model.safetensors").read_bytes()
    metrics = (run / "metrics.jsonl").read_text()
    (run / "ckpt" / "state.pt").unlink()
    with pytest.raises(CheckpointError, match=r"state\.pt is missing.*lenx eval"):
        train(None, run, resume=True, progress=False)
    out = run_cli("train", "--no-progress", "--resume", str(run))
    assert out.returncode == 2 and "state.pt" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    (run / "ckpt" / "state.pt").write_bytes(b"torn")
    with pytest.raises(CheckpointError, match=r"state\.pt is corrupt or unreadable"):
        train(None, run, resume=True, progress=False)
    with pytest.raises(ConfigError, match="already holds"):
        train(tiny(data_root, "train.steps=4"), run, progress=False)
    assert (run / "ckpt" / "model.safetensors").read_bytes() == weights
    assert (run / "metrics.jsonl").read_text() == metrics
    # evaluation needs only the weights
    result = evaluate(run, progress=False)
    assert result["step"] == 4 and result["finished"] is True


def test_a_removed_checkpoint_folder_is_damage_when_metrics_went_past_it(data_root, tmp_path):
    run = tmp_path / "run"
    train(tiny(data_root, "train.steps=6", "train.ckpt_every=2"), run, progress=False)
    import shutil

    shutil.rmtree(run / "ckpt")
    with pytest.raises(CheckpointError, match="no checkpoint"):
        train(None, run, resume=True, progress=False)
    assert len(records(run)) == 6


# --- torn metrics ------------------------------------------------------------------------------------

def test_a_half_written_last_metrics_line_is_dropped(data_root, tmp_path, capsys):
    run = tmp_path / "run"
    cfg = tiny(data_root, "train.steps=6", "train.ckpt_every=2")
    train(cfg, run, progress=False, stop_after=3)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "loss": 5.1')  # a kill in the middle of an append
    summary = train(None, run, resume=True, progress=False)
    assert summary["finished"]
    assert "half-written" in capsys.readouterr().err
    assert [r["step"] for r in records(run)] == [1, 2, 3, 4, 5, 6]


def test_a_corrupt_metrics_line_elsewhere_is_a_one_line_error(data_root, tmp_path):
    run = tmp_path / "run"
    train(tiny(data_root, "train.steps=6", "train.ckpt_every=2"), run, progress=False, stop_after=3)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:10]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(CheckpointError, match="metrics.jsonl line 2") as e:
        train(None, run, resume=True, progress=False)
    assert "\n" not in str(e.value)
    assert ckpt_step(run) == 3


# --- sweeps reuse only what matches the request ------------------------------------------------------

def test_sweep_refuses_a_run_trained_with_another_config(data_root, tmp_path, capsys):
    out = tmp_path / "sw"
    first = sweep(["rope"], tiny(data_root, "train.steps=3"), out, progress=False)
    assert first["results"][0]["step"] == 3
    with pytest.raises(SweepError, match="--force") as e:
        sweep(["rope"], tiny(data_root, "train.steps=5", "model.n_layer=2"), out, progress=False)
    message = str(e.value)
    assert "train.steps: 3 in the run, 5 requested" in message and "model.n_layer: 1 in the run, 2 requested" in message
    assert "\n" not in message
    assert ckpt_step(out / "rope") == 3
    again = sweep(["rope"], tiny(data_root, "train.steps=5", "model.n_layer=2"), out, progress=False, force=True)
    assert again["results"][0]["step"] == 5 and ckpt_step(out / "rope") == 5
    moved = [p for p in out.iterdir() if p.name.startswith("rope.old")]
    assert len(moved) == 1 and ckpt_step(moved[0]) == 3


def test_sweep_reevaluates_stale_evaluations_and_resumes_partial_runs(data_root, tmp_path):
    out = tmp_path / "sw"
    cfg = tiny(data_root, "train.steps=4", "train.ckpt_every=2")
    sweep(["rope"], cfg, out, progress=False)
    weights_time = (out / "rope" / "ckpt" / "model.safetensors").stat().st_mtime_ns
    eval_time = (out / "rope" / "eval.json").stat().st_mtime_ns
    sweep(["rope"], cfg, out, progress=False)  # the same request: nothing to do
    assert (out / "rope" / "eval.json").stat().st_mtime_ns == eval_time
    # other evaluation settings: evaluated again, not retrained
    r = sweep(["rope"], tiny(data_root, "train.steps=4", "train.ckpt_every=2", "eval.windows=3"), out, progress=False)
    assert r["results"][0]["windows"] == 3
    assert (out / "rope" / "ckpt" / "model.safetensors").stat().st_mtime_ns == weights_time
    r = sweep(["rope"], cfg, out, progress=False, eval_kwargs={"lengths": [32]})
    assert r["results"][0]["lengths"] == [32]
    # an evaluation from before windows were made distinct (no window_distinct_documents): redone
    saved = json.loads((out / "rope" / "eval.json").read_text())
    saved.pop("window_distinct_documents")
    (out / "rope" / "eval.json").write_text(json.dumps(saved))
    r = sweep(["rope"], cfg, out, progress=False, eval_kwargs={"lengths": [32]})
    assert "window_distinct_documents" in r["results"][0]
    # an unfinished run with an evaluation of its unfinished checkpoint: resumed, evaluated again
    part = tmp_path / "part"
    train(cfg, part / "rope", progress=False, stop_after=2)
    evaluate(part / "rope", progress=False)
    r = sweep(["rope"], cfg, part, progress=False)
    assert r["results"][0]["step"] == 4 and r["results"][0]["finished"] is True


def test_sweep_checks_every_method_before_training_any(data_root, tmp_path):
    cfg = tiny(data_root, "train.steps=2", "model.backend=sdpa")
    with pytest.raises(ConfigError, match="kerple"):
        sweep(["rope", "kerple"], cfg, tmp_path / "sw", progress=False)
    assert not (tmp_path / "sw" / "rope" / "ckpt").exists()


# --- eval.json says what it evaluated ----------------------------------------------------------------

def test_eval_records_its_checkpoint_and_warns_when_unfinished(data_root, tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny(data_root, "train.steps=4", "train.ckpt_every=2"), run, progress=False, stop_after=2)
    capsys.readouterr()
    r = evaluate(run, progress=False)
    assert (r["step"], r["steps"], r["finished"]) == (2, 4, False)
    saved = json.loads((run / "eval.json").read_text())
    assert (saved["step"], saved["steps"], saved["finished"]) == (2, 4, False)
    err = capsys.readouterr().err
    assert "step 2 of 4" in err and len(err.strip().splitlines()) == 1
    evaluate_task(run, "copy", lengths=[64], depths=[0.5], samples=1, progress=False)
    evaluate(run, lengths=[64, 128], windows=2, progress=False, rope_scaling="yarn")
    capsys.readouterr()
    train(None, run, resume=True, progress=False)
    # what they measured is kept, as a kept step: the weights and the evaluations under its names
    assert (run / "ckpt" / "step_2" / "model.safetensors").is_file()
    for name, kept in (("eval.json", "eval_step2.json"), ("eval_copy.json", "eval_copy_step2.json"),
                       ("eval_rope-yarn.json", "eval_step2_rope-yarn.json")):
        assert not (run / name).exists() and json.loads((run / kept).read_text())["step"] == 2, name
    r = evaluate(run, progress=False)
    assert (r["step"], r["finished"]) == (4, True) and "warning" not in capsys.readouterr().err


# --- evaluation options ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, needle", [
    ({"scored": -5}, "scored must be a positive integer"),
    ({"scored": 0}, "scored must be a positive integer"),
    ({"windows": 0}, "windows must be a positive integer"),
    ({"windows": -1}, "windows must be a positive integer"),
    ({"scored": True}, "scored must be a positive integer"),
    ({"lengths": [0, 64]}, "lengths must be positive integers"),
    ({"lengths": []}, "lengths must be positive integers"),
    ({"lengths": [32, 64], "scored": 48}, "shorter than the 48 scored"),
    ({"token_budget": 0}, "token_budget must be a positive integer"),
])
def test_bad_evaluation_options_fail_before_loading_anything(data_root, tmp_path, kwargs, needle):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(to_toml(tiny(data_root)))  # no checkpoint: loading would fail
    with pytest.raises(ConfigError, match=needle) as e:
        evaluate(run, progress=False, **kwargs)
    assert "\n" not in str(e.value)


# --- runs do not depend on the working directory -----------------------------------------------------

def test_runs_open_from_any_working_directory(data_root, tmp_path):
    # train with a relative data.root from the folder that holds the corpus
    here, elsewhere = data_root.parent, tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    o = TINY + [f"data.root={data_root.name!r}", "train.steps=2"]
    out = run_cli("train", "--no-progress", "-o", str(run), *sets(o), cwd=here)
    assert out.returncode == 0, out.stderr
    assert Path(load_config(run / "config.toml").data.root).samefile(data_root)
    out = run_cli("eval", str(run), "--no-progress", cwd=elsewhere)
    assert out.returncode == 0, out.stderr
    # a run recorded with a relative data.root, opened where that path does not exist
    text = re.sub(r"^root = .*$", 'root = "data"', (run / "config.toml").read_text(), flags=re.M)
    (run / "config.toml").write_text(text)
    assert load_config(run / "config.toml").data.root == "data"
    out = run_cli("eval", str(run), "--no-progress", cwd=elsewhere)
    assert out.returncode == 2 and str(elsewhere / "data") in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (elsewhere / "data").exists()  # no synthetic corpus made there
    # where it does exist, it is used
    os.symlink(data_root, elsewhere / "data")
    out = run_cli("eval", str(run), "--no-progress", cwd=elsewhere)
    assert out.returncode == 0, out.stderr


# --- resuming ------------------------------------------------------------------------------------

def test_resuming_a_finished_run_returns_valid_json(data_root, tmp_path):
    run = tmp_path / "run"
    first = train(tiny(data_root, "train.steps=3"), run, progress=False)
    again = train(None, run, resume=True, progress=False)
    assert again["finished"] and again["final_loss"] == first["final_loss"]
    json.dumps(again, allow_nan=False)


def test_resume_keeps_the_original_command_and_lists_resumes(data_root, tmp_path):
    run = tmp_path / "run"
    train(tiny(data_root, "train.steps=4", "train.ckpt_every=2"), run, progress=False, stop_after=2)
    meta = json.loads((run / "meta.json").read_text())
    meta["environment"]["command"] = "lenx train original"  # as a shell would have recorded it
    (run / "meta.json").write_text(json.dumps(meta))
    train(None, run, resume=True, progress=False)
    after = json.loads((run / "meta.json").read_text())
    assert after["environment"]["command"] == "lenx train original"
    (entry,) = after["resumes"]
    assert entry["step"] == 2 and {"command", "git_commit", "time"} <= set(entry)


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_checkpoints_the_current_step_and_exits(data_root, tmp_path, signum, code):
    run = tmp_path / "run"
    o = overrides(data_root, "train.steps=100000", "train.ckpt_every=100000", "model.dropout=0.1")
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "lenx", "train", "--no-progress", "-o", str(run), *sets(o)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 600
    metrics = run / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None and (
            not metrics.exists() or metrics.read_text().count("\n") < 3):
        time.sleep(0.05)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == code, stderr
    assert f"lenx train --resume {run}" in stderr and "Traceback" not in stderr, stderr
    assert '"finished"' not in stdout
    step = ckpt_step(run)
    assert step >= 3 and records(run)[-1]["step"] == step
    # resuming continues from there, exactly as an uninterrupted run
    train(None, run, resume=True, progress=False, stop_after=3)
    assert ckpt_step(run) == step + 3
    ref = train(load_config("tiny", o), tmp_path / "ref", progress=False, stop_after=step + 3)
    assert [r["step"] for r in records(run)] == list(range(1, step + 4))
    np.testing.assert_array_equal([r["loss"] for r in records(run)], [r["loss"] for r in records(tmp_path / "ref")])
    assert ref["step"] == step + 3


def test_a_signal_inside_a_long_step_stops_at_once_at_the_last_finished_step(data_root, tmp_path, monkeypatch,
                                                                               capsys):
    """SIGTERM during a step's forward and backward passes drops that step and checkpoints the one
    before, instead of finishing it first (a run swapping itself to death must stop when asked). The
    test raises the signal itself, inside micro-batch 3 of 8 of step 2, so where it lands does not
    depend on how busy the machine is; a resume then trains exactly as an uninterrupted run."""
    o = ["train.steps=4", "train.ckpt_every=100000", "train.batch_size=8", "train.grad_accum=8"]
    real, micro_batches = train_module.train_step, []

    def signalled_step(model, optimizer, batches, loss_fn, **kwargs):
        step = len(micro_batches) + 1
        micro_batches.append(0)

        def loss(*batch):
            micro_batches[-1] += 1
            if step == 2 and micro_batches[-1] == 3:
                # delivered to this thread and handled before raise_signal returns
                signal.raise_signal(signal.SIGTERM)
            return loss_fn(*batch)

        return real(model, optimizer, batches, loss, **kwargs)

    assert threading.current_thread() is threading.main_thread()  # else SIGTERM would end the test process
    monkeypatch.setattr(train_module, "train_step", signalled_step)
    run = tmp_path / "run"
    with pytest.raises(train_module.TrainingInterrupted) as stopped:
        train(tiny(data_root, *o), run, progress=False)
    assert (stopped.value.signum, stopped.value.step, stopped.value.code) == (signal.SIGTERM, 1, 143)
    assert micro_batches == [8, 3], "step 2 went on after the signal"
    assert "interrupted by SIGTERM at step 1 of 4" in capsys.readouterr().err
    assert ckpt_step(run) == 1 and [r["step"] for r in records(run)] == [1]
    monkeypatch.setattr(train_module, "train_step", real)
    train(None, run, resume=True, progress=False)
    train(tiny(data_root, *o), tmp_path / "ref", progress=False)
    assert [r["step"] for r in records(run)] == [1, 2, 3, 4] and ckpt_step(run) == 4
    np.testing.assert_array_equal([r["loss"] for r in records(run)], [r["loss"] for r in records(tmp_path / "ref")])


def test_tensorboard_purges_steps_after_the_checkpoint_on_resume(data_root, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    run = tmp_path / "run"
    cfg = tiny(data_root, "train.steps=8", "train.ckpt_every=3")
    real = train_module.run_step

    def dies_at_5(run_, step, stop=None):
        if step == 4:
            raise RuntimeError("killed")
        return real(run_, step, stop)

    monkeypatch.setattr(train_module, "run_step", dies_at_5)
    with pytest.raises(RuntimeError, match="killed"):
        train(cfg, run, progress=False)
    monkeypatch.setattr(train_module, "run_step", real)
    train(None, run, resume=True, progress=False)
    newest = max((run / "tb").glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns)
    starts = [e.step for e in EventFileLoader(str(newest)).Load() if e.HasField("session_log")
              and e.session_log.status == e.session_log.START]
    assert starts == [3]


# --- validation loss -----------------------------------------------------------------------------

def test_validation_loss_is_logged_and_leaves_training_untouched(data_root, tmp_path, monkeypatch):
    o = ["train.steps=6", "train.ckpt_every=2", "model.dropout=0.1"]
    plain = train(tiny(data_root, *o), tmp_path / "plain", progress=False)
    keys = {"val_every": 2, "val_batches": 2}
    with_train_keys(monkeypatch, **keys)
    full = train(tiny(data_root, *o, **keys), tmp_path / "full", progress=False)
    # the training RNG stream (dropout) is that of a run without validation
    assert [r["loss"] for r in records(tmp_path / "full")] == [r["loss"] for r in records(tmp_path / "plain")]
    vals = {r["step"]: r["val_loss"] for r in records(tmp_path / "full") if "val_loss" in r}
    assert set(vals) == {2, 4, 6} and all(math.isfinite(v) for v in vals.values())
    assert full["val_loss"] == vals[6] and plain.get("val_loss") is None
    # interrupted and resumed: the same records, bit for bit
    train(tiny(data_root, *o, **keys), tmp_path / "cut", progress=False, stop_after=3)
    train(None, tmp_path / "cut", resume=True, progress=False)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("time", "tokens_per_s")} for r in rs]  # noqa: E731
    assert strip(records(tmp_path / "cut")) == strip(records(tmp_path / "full"))
    # the same validation batches for every method
    from lenx.training.loop import validation_batches

    corpus = train_module.open_training_corpus(tiny(data_root))
    a = validation_batches(tiny(data_root, *o, **keys), corpus)
    b = validation_batches(tiny(data_root, *o, "model.method=kerple", **keys), corpus)
    assert len(a) == len(b) == 2 and all(ids is None for _, ids in a + b)  # stream windows: no document ids
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(a, b))
    # ... and for every training seed: the corpus (eval.seed) draws them, not train.seed
    c = validation_batches(tiny(data_root, *o, "train.seed=7", **keys), corpus)
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(a, c))
    d = validation_batches(tiny(data_root, *o, "eval.seed=99", **keys), corpus)
    assert not all(torch.equal(x, y) for (x, _), (y, _) in zip(a, d))
    assert json.loads((tmp_path / "full" / "meta.json").read_text())["validation_windows"] == "eval.seed"


def test_a_run_begun_before_validation_was_fixed_resumes_with_its_own_windows(data_root, tmp_path, monkeypatch):
    """A run whose meta.json does not say how its validation windows were drawn began when
    train.seed drew them: resumed, it keeps those windows, so its val_loss curve stays one curve."""

    keys = {"val_every": 2, "val_batches": 1}
    with_train_keys(monkeypatch, **keys)
    cfg = tiny(data_root, "train.steps=4", "train.ckpt_every=2", "train.seed=3", **keys)
    train(cfg, tmp_path / "old", progress=False, stop_after=2)
    meta = json.loads((tmp_path / "old" / "meta.json").read_text())
    del meta["validation_windows"]
    (tmp_path / "old" / "meta.json").write_text(json.dumps(meta))
    seen = []
    real = train_module.validation_batches
    monkeypatch.setattr(train_module, "validation_batches", lambda *a: seen.append(a[3]) or real(*a))
    train(None, tmp_path / "old", resume=True, progress=False)
    assert seen == [3]


# --- kept checkpoints ------------------------------------------------------------------------------

def test_kept_checkpoints_survive_resume_and_evaluate_by_step(data_root, tmp_path, monkeypatch):
    with_train_keys(monkeypatch, keep_every=2)
    run = tmp_path / "run"
    cfg = tiny(data_root, "train.steps=6", "train.ckpt_every=6", keep_every=2)
    train(cfg, run, progress=False, stop_after=3)
    train(None, run, resume=True, progress=False)
    kept = sorted(p.name for p in (run / "ckpt").glob("step_*"))
    assert kept == ["step_2", "step_4", "step_6"]
    early = evaluate(run, step=2, progress=False)
    assert (early["step"], early["finished"]) == (2, False)
    assert json.loads((run / "eval_step2.json").read_text())["step"] == 2
    final = evaluate(run, progress=False)
    assert final["step"] == 6 and early["results"] != final["results"]
    with pytest.raises(CheckpointError, match="kept steps: 2, 4, 6"):
        evaluate(run, step=3, progress=False)
