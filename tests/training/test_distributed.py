"""Data-parallel training under torchrun on CPU (gloo, 2 processes): DDP and FSDP2 follow the loss
curve of one process with the same global batch, checkpoints move between world sizes, a failing
rank stops the job, and a sweep runs methods side by side."""

import json
import os
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest
import torch

from lenx.config import load_config
from lenx.model import LM
from lenx.model.checkpoint import checkpoint_dir, load_weights
from lenx.training.loop import train

# Two layers (so per-block sharding and T5's cross-layer table are exercised), two micro-batches
# per step (gradient sync skipped on the first), two ranks of one sequence each per micro-batch.
TINY = ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "model.chunk_size=16", "train.seq_len=32",
        "train.batch_size=4", "train.grad_accum=2", "train.steps=6", "train.ckpt_every=3", "train.log_every=1",
        "train.device=cpu", "eval.max_length=64", "eval.windows=2", "eval.scored=16"]

# Runs train() for a few steps on every rank, then stops (checkpointing first).
STOP_WORKER = """
import sys
from lenx.config import load_config
from lenx.training import distributed
from lenx.training.loop import train
run_dir, stop_after, *overrides = sys.argv[1:]
train(load_config("tiny", overrides), run_dir, progress=False, stop_after=int(stop_after))
distributed.teardown()
"""

# The real CLI, with a data error planted on rank 1 at step 3 (or a NaN loss on rank 1 alone).
FAIL_WORKER = """
import os, sys
import torch
from lenx.cli import main
from lenx.data import DataError
from lenx.training import loop as train
real_get = train.Batches.get
def get(self, step, micro, device):
    if self.info.rank == 1 and step == 2:
        if os.environ["FAIL"] == "data":
            raise DataError("planted data error on rank 1")
        x, y = real_get(self, step, micro, device)
        return x, torch.full_like(y, -100)  # every target ignored: this rank's loss is NaN
    return real_get(self, step, micro, device)
train.Batches.get = get
sys.argv[0] = "lenx"
sys.exit(main())
"""


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(autouse=True)
def one_thread():
    """One thread, like each torchrun worker: the reference runs stay fast on a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def overrides(data_root, method, *extra):
    return TINY + [f"data.root={str(data_root)!r}", f"model.method={method}", *extra]


def sets(items):
    return [a for o in items for a in ("--set", o)]


def torchrun(*args, env=None, timeout=600):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def curve(run_dir):
    return [json.loads(line)["loss"] for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def step_of(run_dir):
    return torch.load(checkpoint_dir(run_dir) / "state.pt", weights_only=False)["step"]


def assert_plain_checkpoint(run_dir, cfg):
    """The checkpoint loads into a plain single-process model (full, unsharded, original shapes)."""
    cfg.model.vocab_size = json.loads((Path(run_dir) / "meta.json").read_text())["vocab_size"]
    load_weights(LM(cfg.model), checkpoint_dir(run_dir))


def assert_same_optimizer_layout(run_a, run_b):
    """The same parameter names, groups and state shapes as another run's checkpoint: resumable by it."""
    a, b = (torch.load(checkpoint_dir(r) / "state.pt", weights_only=False)["optimizer"] for r in (run_a, run_b))
    groups = lambda state: [{k: v for k, v in g.items() if k != "lr"} for g in state["param_groups"]]  # noqa: E731
    assert groups(a) == groups(b) and a["state"].keys() == b["state"].keys()
    for name, entry in a["state"].items():
        assert {k: v.shape for k, v in entry.items()} == {k: v.shape for k, v in b["state"][name].items()}, name


def test_ddp_matches_one_process(data_root, tmp_path):
    """`torchrun -m lenx train` with DDP: same loss curve as one process, output from rank 0 only."""
    o = overrides(data_root, "dapev2-kerple")
    ref = train(load_config("tiny", o), tmp_path / "ref", progress=False)
    out = torchrun("-m", "lenx", "train", "--no-progress", "-o", str(tmp_path / "ddp"), *sets(o))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count('"finished": true') == 1  # the summary is printed by rank 0 alone
    np.testing.assert_allclose(curve(tmp_path / "ddp"), curve(tmp_path / "ref"), rtol=1e-4)
    assert json.loads((tmp_path / "ddp" / "meta.json").read_text())["world_size"] == 2
    assert ref["finished"] and step_of(tmp_path / "ddp") == 6
    assert_plain_checkpoint(tmp_path / "ddp", load_config("tiny", o))
    assert_same_optimizer_layout(tmp_path / "ddp", tmp_path / "ref")


def test_fsdp_saved_on_two_resumes_on_one(data_root, tmp_path):
    """FSDP2 (FIRE: 0-dim parameters, sharded per block): 3 steps on 2 ranks, the gathered checkpoint
    resumed by one process; the whole curve is the single-process one."""
    o = overrides(data_root, "fire", "train.parallel=fsdp")
    train(load_config("tiny", o), tmp_path / "ref", progress=False)
    script = tmp_path / "stop_worker.py"
    script.write_text(STOP_WORKER)
    out = torchrun(str(script), str(tmp_path / "run"), "3", *o)
    assert out.returncode == 0, out.stderr[-3000:]
    assert step_of(tmp_path / "run") == 3
    assert_plain_checkpoint(tmp_path / "run", load_config("tiny", o))
    assert_same_optimizer_layout(tmp_path / "run", tmp_path / "ref")  # FIRE's scalars keep their 0-dim shape
    resumed = train(None, tmp_path / "run", resume=True, progress=False)
    assert resumed["finished"]
    np.testing.assert_allclose(curve(tmp_path / "run"), curve(tmp_path / "ref"), rtol=1e-4)


def test_one_process_checkpoint_resumes_on_two_with_fsdp(data_root, tmp_path):
    """A run saved by one process continues under `torchrun -m lenx train --resume` with FSDP2
    (T5's table is shared by the blocks: the model is one FSDP unit)."""
    o = overrides(data_root, "t5", "train.parallel=fsdp")
    train(load_config("tiny", o), tmp_path / "ref", progress=False)
    train(load_config("tiny", o), tmp_path / "run", progress=False, stop_after=3)
    out = torchrun("-m", "lenx", "train", "--no-progress", "--resume", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr[-3000:]
    np.testing.assert_allclose(curve(tmp_path / "run"), curve(tmp_path / "ref"), rtol=1e-4)
    assert step_of(tmp_path / "run") == 6
    assert_plain_checkpoint(tmp_path / "run", load_config("tiny", o))


@pytest.mark.parametrize("fail, needle", [("data", "[rank 1/2] error: planted data error on rank 1"),
                                          ("nan", "[rank 0/2] error: loss became nan at step 3")])
def test_a_failing_rank_stops_the_job(data_root, tmp_path, fail, needle):
    """An exception on one rank (or a NaN loss on one rank) ends every process with the message,
    instead of leaving the other rank waiting in a collective."""
    script = tmp_path / "fail_worker.py"
    script.write_text(FAIL_WORKER)
    # a rank left waiting in a collective would hang until the timeout (an exception, not a pass)
    out = torchrun(str(script), "train", "--no-progress", "-o", str(tmp_path / "run"),
                   *sets(overrides(data_root, "rope")), env={**os.environ, "FAIL": fail}, timeout=600)
    assert out.returncode != 0
    assert needle in out.stderr, out.stderr[-3000:]
    assert '"finished"' not in out.stdout
    assert checkpoint_dir(tmp_path / "run") is None  # it failed before the first checkpoint (step 3)


def test_parallel_sweep_runs_methods_in_separate_processes(data_root, tmp_path):
    o = overrides(data_root, "kerple", "train.steps=4", "train.ckpt_every=4")
    out = subprocess.run([sys.executable, "-m", "lenx", "sweep", "--methods", "rope,kerple", "--jobs", "2",
                          "--no-progress", "-o", str(tmp_path / "sw"), *sets(o)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[sweep] rope: started on CPU" in out.stdout and "[sweep] kerple: done" in out.stdout
    results = json.loads((tmp_path / "sw" / "results.json").read_text())
    assert [r["method"] for r in results["runs"]] == ["rope", "kerple"]
    # Each method's run is the one a lone process would train.
    alone = train(load_config("tiny", o), tmp_path / "alone", progress=False)
    np.testing.assert_allclose(curve(tmp_path / "sw" / "kerple")[-1], alone["final_loss"], rtol=1e-5)
    assert (tmp_path / "sw" / "kerple" / "sweep.log").exists()
