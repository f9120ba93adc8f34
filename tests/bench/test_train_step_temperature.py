"""The temperature rows of `lenx bench --train-step` (issue 42: the same speed as without): a query
temperature runs each method on its own backend, and the bench times it beside the method alone; the
kernel benchmark, which times the attention's kernels alone (the same with a temperature), refuses one."""

import os
from pathlib import Path
import subprocess
import sys

import lenx
from lenx.bench.train_step import train_step_bench

SRC = str(Path(lenx.__file__).resolve().parents[1])


def test_temperature_rows_run_on_their_method_s_backend():
    methods = ["kerple", "ssmax-kerple", "logn-kerple", "rope", "l4temp-rope"]
    res = train_step_bench(methods, preset="tiny", seq_len=16, batch_size=2, vocab_size=64, steps=1, warmup=1,
                           device="cpu", profile_steps=0, log=None, reference="kerple")
    rows = {r["method"]: r for r in res["rows"]}
    assert all("error" not in r and r["median_ms"] > 0 for r in rows.values()), rows
    for method in methods:
        base = method.split("-", 1)[1] if method.startswith(("ssmax-", "logn-", "l4temp-")) else method
        assert rows[method]["backends"] == rows[base]["backends"], method
    # the temperature adds one parameter per head (SSMax's s_h) and nothing else
    assert rows["ssmax-kerple"]["params"] - rows["kerple"]["params"] == 2 * 4  # tiny: 2 layers of 4 heads
    assert rows["logn-kerple"]["params"] == rows["kerple"]["params"]


def test_the_kernel_benchmark_sends_a_temperature_to_the_step_benchmarks(tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "lenx", "bench", "--methods", "kerple,logn-kerple", "-o", "b.json"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--train-step or --decode" in lines[0], proc.stderr
    assert not (tmp_path / "b.json").exists()
