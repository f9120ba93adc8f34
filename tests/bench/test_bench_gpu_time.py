"""`lenx bench --gpu-time N`: the kernel rows' GPU kernel time per call from torch.profiler (CPU:
the option, its errors, the row fields with the timing stubbed, the table; GPU: a tiny real row)."""

import io
import subprocess
import sys

import pytest
import torch
from rich.console import Console

from lenx.bench import kernels
from lenx.config import ConfigError
from lenx.report.bench_tables import bench_table
from lenx.report.tables import show, to_markdown


def lenx(*args, cwd):
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.mark.parametrize("args,start", [
    (["--gpu-time", "-1"], "error: --gpu-time"),
    (["--gpu-time", "2", "--train-step"], "error: --gpu-time"),
    (["--gpu-time", "2", "--decode"], "error: --gpu-time"),
    (["--gpu-time", "two"], "error: Invalid value for '--gpu-time'"),
])
def test_a_bad_gpu_time_is_one_error_line(tmp_path, args, start):
    out = lenx("bench", *args, cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith(start), out.stderr
    assert not any(tmp_path.iterdir())


def test_the_option_reaches_run_bench_and_the_table(monkeypatch, tmp_path):
    """--gpu-time 3 is run_bench's gpu_time=3, and the table shows the two GPU columns."""
    from typer.testing import CliRunner

    from lenx.cli import app

    seen = {}

    def fake_run_bench(**kw):
        seen.update(kw)
        return fake_result(kw["gpu_time"])

    monkeypatch.setattr(kernels, "run_bench", fake_run_bench)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["bench", "--methods", "kerple", "--backends", "triton", "--lengths", "256",
                                   "--gpu-time", "3", "--commit", "x"])
    assert res.exit_code == 0, res.output
    assert seen["gpu_time"] == 3
    assert "fwd+bwd GPU" in res.output and "0.456" in res.output
    seen.clear()
    res = CliRunner().invoke(app, ["bench", "--methods", "kerple", "--lengths", "256", "--commit", "x",
                                   "-o", "b2.json"])
    assert res.exit_code == 0 and seen["gpu_time"] == 0 and "GPU ms" not in res.output, res.output


def fake_result(gpu_time):
    row = {"method": "kerple", "backend": "triton", "T": 256, "status": "ok", "fwd_ms": 0.5, "fwdbwd_ms": 2.0,
           "fwd_peak_mib": 1.0, "fwdbwd_peak_mib": 2.0}
    if gpu_time:
        row.update(fwd_gpu_ms=0.123, fwdbwd_gpu_ms=0.456)
    return {"device": "test", "torch": "x", "triton": "y", "cuda": "z", "git_commit": "abc",
            "args": {"batch": 1, "heads": 2, "head_dim": 16, "dtype": "bfloat16", "gpu_time": gpu_time},
            "rows": [row, {"method": "sdpa", "backend": "triton", "T": 256, "status": "oom"}]}


def test_table_columns():
    md = to_markdown(bench_table(fake_result(2)))
    assert "| fwd GPU ms | fwd+bwd GPU ms |" in md
    assert "| kerple | triton | 256 | 0.500 |  | 2.000 |  | 2 |  | 0.123 | 0.456 |" in md
    assert "mean of 2 profiled calls" in md
    buf = io.StringIO()
    show([bench_table(fake_result(0))], Console(file=buf, width=200))
    assert "GPU" not in buf.getvalue()


def test_rows_carry_the_profiled_time(monkeypatch):
    """_measure, with the CUDA calls and both timers stubbed (a CPU row on the chunked backend): each mode
    gets <mode>_gpu_ms from profiled_gpu_ms over gpu_time calls of that mode's call, none without it."""
    for name in ("synchronize", "reset_peak_memory_stats", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 0)
    monkeypatch.setattr(kernels, "median_ms", lambda fn, *a: (fn(), (1.0, 5, 2.0, 1.5))[1])
    profiled = []

    def fake_gpu_ms(fn, calls, device):
        fn()
        profiled.append(calls)
        return 0.25 * len(profiled)

    monkeypatch.setattr(kernels, "profiled_gpu_ms", fake_gpu_ms)
    common = dict(batch=1, heads=2, head_dim=16, dtype=torch.bfloat16, device=torch.device("cpu"), chunk_size=8,
                  dape_hidden=4, dape_kernel=3, warmup_ms=1, rep_ms=1, max_reps=1, window=4)
    row = kernels._measure("kerple", "chunked", 16, gpu_time=3, **common)
    assert row["status"] == "ok" and profiled == [3, 3]
    assert row["fwd_gpu_ms"] == 0.25 and row["fwdbwd_gpu_ms"] == 0.5 and row["fwdbwd_ms"] == 1.0
    profiled.clear()
    row = kernels._measure("kerple", "chunked", 16, gpu_time=0, **common)
    assert profiled == [] and "fwd_gpu_ms" not in row and "fwdbwd_gpu_ms" not in row


def test_profiled_time_counts_the_calls():
    """The real profiler on a CPU (the CPU ops' self time there): one unprofiled call, then `calls`."""
    calls = []
    x = torch.randn(64, 64)

    def fn():
        calls.append(1)
        return x @ x

    assert kernels.profiled_gpu_ms(fn, 3, torch.device("cpu")) > 0
    assert len(calls) == 4


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_run_bench_checks_gpu_time_first(bad):
    with pytest.raises(ConfigError, match="gpu_time"):
        kernels.run_bench(gpu_time=bad, log=None)


@pytest.mark.gpu
def test_tiny_row_with_gpu_time():
    res = kernels.run_bench(methods=("sdpa", "kerple"), lengths=(256,), heads=2, head_dim=32,
                            backends=("sdpa", "triton"), rep_ms=5, max_reps=3, commit="test", gpu_time=2, log=None)
    assert res["args"]["gpu_time"] == 2
    for r in res["rows"]:
        if r["status"] != "ok":
            continue
        # kernels ran; a call's kernel time cannot much exceed the wall time of that call alone
        assert 0 < r["fwd_gpu_ms"] < r["fwdbwd_gpu_ms"], r
        assert r["fwdbwd_gpu_ms"] < 2 * r["fwdbwd_synced_ms"] + 0.1, r
    assert {(r["method"], r["backend"]) for r in res["rows"] if r["status"] == "ok"} >= {("sdpa", "sdpa"),
                                                                                         ("kerple", "triton")}
