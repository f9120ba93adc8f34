"""The memory estimate of a training step (lenx.model.memory) against the peak that steps measure,
and the check that refuses a step too large for the device before any work starts."""

import json
import os
from pathlib import Path
import subprocess
import sys

import pytest
import torch

from lenx.attention.methods import all_methods
from lenx.config import ConfigError, LMConfig, load_config
from lenx.model import LM, check_training_memory, estimate_memory
from lenx.model import memory

SRC = Path(__file__).resolve().parents[2] / "src"
CPU = torch.device("cpu")
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# One process per case: warm up with a tiny step of the same model (code paths, thread pools), then
# take two steps (the second with AdamW's state) or one forward under the profiler, and report the
# peak of the bytes that tensors hold above the start, from its allocation events. The estimate
# counts tensors; what the allocator keeps on top is the platform's: resident memory of the chunked
# cases measured 2.5x apart on two 2-core x86 machines (glibc's heap), tensor bytes do not move.
MEASURE = r"""
import json, sys
import torch
from torch.profiler import ProfilerActivity, profile
from lenx.config import load_config
from lenx.model import LM
from lenx.training.optim import adamw
from lenx.training.step import train_step

overrides, training = json.loads(sys.argv[1]), sys.argv[2] == "train"
torch.set_num_threads(1)  # pytest runs two workers on two cores


def run(cfg):
    model = LM(cfg.model)
    t = cfg.train
    rows = t.batch_size // t.grad_accum
    window = lambda: torch.randint(0, cfg.model.vocab_size, (rows, t.seq_len + 1))
    if not training:
        with torch.no_grad():
            x = window()
            model(x[:, :-1], x[:, 1:])
        return
    opt = adamw(model, t, torch.device("cpu"))
    for _ in range(2):
        batches = [(w[:, :-1], w[:, 1:]) for w in (window() for _ in range(t.grad_accum))]
        train_step(model, opt, batches, lambda x, y: model(x, y)[1], clip=1.0)


run(load_config("tiny", overrides + ["train.seq_len=8", "train.batch_size=1", "train.grad_accum=1"]))
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    run(load_config("tiny", overrides))
live = peak = 0
for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                        if e.name() == "[memory]"):
    live += nbytes
    peak = max(peak, live)
print(json.dumps(peak))
"""

# (overrides of the tiny preset, training): 90-300 MB of tensors each. Estimate / peak measured on a
# 2-core x86 CPU: 1.01 to 1.63 (the chunked cases over-estimate their backward's transients).
CASES = [
    pytest.param(["train.seq_len=512", "train.batch_size=16", "train.grad_accum=2", "model.vocab_size=4000"], True,
                 id="sdpa-logits-grad_accum"),
    pytest.param(["train.seq_len=768", "train.batch_size=4", "model.backend='dense'"], True, id="dense"),
    pytest.param(["train.seq_len=1024", "train.batch_size=4", "model.method='alibi'"], True, id="chunked-alibi"),
    pytest.param(["train.seq_len=512", "train.batch_size=2", "model.method='dapev2-kerple'"], True,
                 id="chunked-dapev2"),
    pytest.param(["train.seq_len=1024", "train.batch_size=4", "model.method='dapev2-kerple'"], False,
                 id="forward-chunked-dapev2"),
]


def measured_peak(overrides: list[str], training: bool) -> int:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(overrides), "train" if training else "forward"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("overrides, training", CASES)
def test_the_estimate_is_within_2x_of_the_measured_peak(overrides, training):
    cfg = load_config("tiny", overrides)
    t = cfg.train
    estimate = estimate_memory(cfg.model, t.batch_size // t.grad_accum, t.seq_len, CPU, training=training)
    peak = measured_peak(overrides, training)
    assert 0.5 <= estimate.total / peak <= 2, (estimate.describe(), estimate.total, peak)


@pytest.mark.parametrize("method", all_methods())
def test_the_parameter_count_is_the_models(method):
    """Weights, gradients and AdamW's two moments, fp32: 16 bytes a parameter (T5's table, shared by
    the layers, once)."""
    cfg = LMConfig(method=method, vocab_size=300, n_layer=3)
    assert estimate_memory(cfg, 2, 16, CPU).model == 16 * LM(cfg).num_params()


def test_what_the_estimate_grows_with():
    cfg = LMConfig(method="rope", vocab_size=256)
    one, two = (estimate_memory(cfg, 4, T, CPU) for T in (1024, 2048))
    assert one.backend == "sdpa" and 1.9 < two.total / one.total < 2.1  # O(T) attention: linear in T
    dense = LMConfig(method="rope", vocab_size=256, backend="dense")
    one, two = (estimate_memory(dense, 4, T, CPU).attention for T in (1024, 2048))
    assert 3.9 < two / one < 4.1  # the score maps: T^2
    assert estimate_memory(cfg, 4, 1024, CPU, training=False).total < estimate_memory(cfg, 4, 1024, CPU).total
    # bf16 autocast: fewer bytes of activations, a bf16 copy of the weights
    bf16, fp32 = (estimate_memory(cfg, 4, 1024, CPU, precision=p) for p in ("bf16", "fp32"))
    assert bf16.activations < fp32.activations and bf16.model > fp32.model
    # FSDP shards the weights, gradients and optimizer state; DDP adds its gradient buckets
    single = estimate_memory(cfg, 4, 1024, CPU).model
    assert estimate_memory(cfg, 4, 1024, CPU, world=4, parallel="fsdp").model == single // 4
    assert estimate_memory(cfg, 4, 1024, CPU, world=4).model > single


def test_a_step_that_does_not_fit_is_one_line_naming_what_to_lower(monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda device: 10 ** 6)
    cfg = load_config("tiny")
    cfg.train.grad_accum = 2
    with pytest.raises(ConfigError) as e:
        check_training_memory(cfg, CPU)
    line = str(e.value)
    assert "\n" not in line and "needs about" in line and "0.0 GB available" in line
    for name in ("train.seq_len", "train.batch_size", "train.grad_accum", "--no-memory-check"):
        assert name in line, line
    cfg.train.batch_size = cfg.train.grad_accum = 2  # one sequence per micro-batch: nothing left to split
    with pytest.raises(ConfigError, match="one sequence already"):
        check_training_memory(cfg, CPU)
    monkeypatch.setattr(memory, "available_memory", lambda device: 10 ** 12)
    assert check_training_memory(cfg, CPU).total > 0


def test_where_memory_cannot_be_told_the_check_says_so_and_passes(monkeypatch, capsys):
    monkeypatch.setattr(memory, "available_memory", lambda device: None)
    check_training_memory(load_config("tiny", ["train.seq_len=100000"]), CPU)
    assert "memory check is skipped" in capsys.readouterr().err


@LINUX
def test_available_cpu_memory_is_at_most_the_machines():
    total = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemTotal")).split()[1]) * 1024
    assert 0 < memory.available_memory(CPU) <= total


def test_cgroup_limits_count_and_the_tightest_wins(tmp_path):
    """v1 (the memory controller's folder) and v2: limit - usage + reclaimable page cache, of the
    process's cgroup or one above it, whichever leaves least; no limit anywhere: None."""
    proc = tmp_path / "cgroup"
    v1 = tmp_path / "fs" / "memory" / "jobs" / "one"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # unlimited here
    (v1 / "memory.usage_in_bytes").write_text("100\n")
    (v1.parent / "memory.limit_in_bytes").write_text("1000\n")  # the parent's limit applies
    (v1.parent / "memory.usage_in_bytes").write_text("600\n")
    (v1.parent / "memory.stat").write_text("cache 50\ntotal_inactive_file 30\n")
    proc.write_text("5:cpu:/jobs/one\n4:memory:/jobs/one\n")
    assert memory._cgroup_room(proc, tmp_path / "fs") == 1000 - 600 + 30
    v2 = tmp_path / "fs" / "box"
    v2.mkdir()
    (v2 / "memory.max").write_text("300\n")
    (v2 / "memory.current").write_text("200\n")
    proc.write_text("4:memory:/jobs/one\n0::/box\n")
    assert memory._cgroup_room(proc, tmp_path / "fs") == 100
    (v2 / "memory.max").write_text("max\n")
    proc.write_text("0::/box\n")
    assert memory._cgroup_room(proc, tmp_path / "fs") is None
    assert memory._cgroup_room(tmp_path / "missing", tmp_path / "fs") is None


def lenx_with_peak(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, int]:
    """`lenx ARGS` run by a fresh Python whose only child it is: (its output, the child's peak
    resident bytes (RUSAGE_CHILDREN))."""
    code = ("import json, resource, subprocess, sys\n"
            "out = subprocess.run([sys.executable, '-m', 'lenx', *sys.argv[1:]], capture_output=True, text=True)\n"
            "print(json.dumps([out.returncode, out.stdout, out.stderr, "
            "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024]))")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600,
                         cwd=cwd, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rc, stdout, stderr, peak = json.loads(out.stdout)
    return subprocess.CompletedProcess(args, rc, stdout, stderr), peak


@LINUX
def test_train_at_seq_len_100000_fails_at_once_without_allocating(tmp_path):
    """The tiny preset at train.seq_len=100000 once grew to 22 GB and was killed by the OOM killer
    7 minutes later. Now it is refused before the model is built. (On a machine with more memory
    than the step's ~41 GB, the batch grows until it does not fit.)"""
    cfg = load_config("tiny", ["train.seq_len=100000"])
    estimate = estimate_memory(cfg.model, cfg.train.batch_size, 100000, CPU)
    assert estimate.total > 30e9
    batch = cfg.train.batch_size * (1 + memory.available_memory(CPU) // estimate.total)
    out, peak = lenx_with_peak(["train", "--set", "train.seq_len=100000", "--set",
                                         f"train.batch_size={batch}", "-o", "run"], tmp_path)
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith("error: training at train.seq_len=100000") and "GB available" in lines[0]
    assert "--no-memory-check" in lines[0]
    assert peak < 2e9, f"the refused run took {peak / 1e9:.1f} GB"
    assert not (tmp_path / "run").exists()


def test_no_memory_check_trains_what_the_check_refuses(tmp_path, monkeypatch, capsys):
    """In process, with the device pretending to have 1 MB: refused, then trained with the override."""
    from lenx.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(memory, "available_memory", lambda device: 10 ** 6)
    args = ["train", "--set", "train.steps=1", "--set", "train.seq_len=16", "--no-progress", "-o", "run"]
    assert main(args) == 2
    assert "needs about" in capsys.readouterr().err and not (tmp_path / "run").exists()
    assert main([*args, "--no-memory-check"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["finished"] is True
    # resuming the finished run trains nothing, so it needs no memory check: it says it has finished
    assert main(["train", "--resume", "run", "--no-progress"]) == 0
    assert "already finished training" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("method, backend", [("rope", "auto"), ("alibi", "auto"), ("dapev2-kerple", "auto"),
                                             ("alibi", "chunked")])
def test_the_estimate_is_within_2x_of_the_measured_peak_on_cuda(method, backend, monkeypatch):
    """bf16 autocast, the backends the planner picks on CUDA (sdpa, triton), and the chunked
    reference. The skewed DAPE V2 kernels are off: they take their buffers only when they fit."""
    from lenx.training.optim import adamw
    from lenx.training.step import train_step
    from lenx.model.precision import autocast_for

    monkeypatch.setenv("LENX_DAPE_V2_SKEWED", "0")
    device = torch.device("cuda")
    cfg = LMConfig(method=method, backend=backend, vocab_size=4096, n_layer=4, n_head=8, d_model=512)
    batch, T = 8, 2048
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    model = LM(cfg).to(device)
    opt = adamw(model, load_config("tiny").train, device)
    for _ in range(2):
        x = torch.randint(0, cfg.vocab_size, (batch, T + 1), device=device)
        train_step(model, opt, [(x[:, :-1], x[:, 1:])], lambda a, b: model(a, b)[1], clip=1.0,
                   autocast=lambda: autocast_for(device, "auto"))
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    estimate = estimate_memory(cfg, batch, T, device)
    assert 0.5 <= estimate.total / peak <= 2, (estimate.describe(), estimate.total, peak)
