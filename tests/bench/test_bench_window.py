"""`lenx bench --window`: the kernel rows with a sliding window; a bad one is one error line."""

import subprocess
import sys

import pytest
import torch

from lenx.attention.backends import fused, unsupported_reason
from lenx.bench.kernels import _parts


def lenx(*args, cwd):
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.mark.parametrize("args", [["--window", "-3"], ["--window", "4", "--decode"], ["--window", "4", "--train-step"]])
def test_a_bad_window_is_one_error_line(tmp_path, args):
    out = lenx("bench", *args, cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: --window"), out.stderr
    assert not any(tmp_path.iterdir())


def test_the_rows_carry_the_window(monkeypatch):
    monkeypatch.setattr(fused.importlib.util, "find_spec", lambda name: object())  # as on a machine with triton
    parts, _ = _parts("kerple", 2, 16, torch.device("cpu"), 4, 3, window=64)
    assert parts.window == 64
    assert unsupported_reason("triton", parts, torch.device("cuda")) is None  # the fused kernels take it
    parts, _ = _parts("dapev2-kerple", 2, 16, torch.device("cpu"), 4, 3, window=64)
    assert unsupported_reason("triton", parts, torch.device("cuda")) is None  # DAPE V2's O(T) kernel takes it
