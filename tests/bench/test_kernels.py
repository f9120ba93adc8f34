"""The kernel benchmark (lenx.bench.kernels): its table and ratios (CPU), and a tiny real run (GPU)."""

import io
import json

import pytest
import torch
from rich.console import Console

from lenx.bench.kernels import _add_ratios, _bound, _gate_logits, _parts, run_bench
from lenx.report.bench_tables import bench_table
from lenx.report.tables import show, to_markdown


def fake_result():
    rows = [
        {"method": "sdpa", "backend": "sdpa", "T": 512, "status": "ok", "fwd_ms": 0.1, "fwdbwd_ms": 0.4,
         "fwd_peak_mib": 10.0, "fwdbwd_peak_mib": 20.0},
        {"method": "kerple", "backend": "triton", "T": 512, "status": "ok", "fwd_ms": 0.2, "fwdbwd_ms": 1.0,
         "fwd_peak_mib": 10.0, "fwdbwd_peak_mib": 30.0},
        {"method": "kerple", "backend": "dense", "T": 512, "status": "ok", "fwd_status": "oom",
         "fwdbwd_status": "oom"},
        {"method": "kerple", "backend": "sdpa", "T": 512, "status": "unsupported: no bias"},
        {"method": "dapev2-kerple", "backend": "triton", "T": 512, "status": "ok", "fwd_ms": 2.0, "fwdbwd_ms": 8.0,
         "fwd_peak_mib": 10.0, "fwdbwd_peak_mib": 30.0, "fwd_kernel": "gluon"},
    ]
    return {"device": "test", "torch": "x", "triton": "y", "cuda": "z", "git_commit": "abc",
            "args": {"batch": 1, "heads": 2, "head_dim": 16, "dtype": "bfloat16"}, "rows": rows}


def test_ratios_and_table():
    res = fake_result()
    _add_ratios(res)
    row = res["rows"][1]
    assert row["fwd_x_sdpa"] == pytest.approx(2.0)
    assert row["fwdbwd_x_sdpa"] == pytest.approx(2.5)
    assert row["fwdbwd_mem_x_sdpa"] == pytest.approx(1.5)
    buf = io.StringIO()
    show([bench_table(res)], Console(file=buf, width=200))
    text = buf.getvalue()
    assert "triton" in text and "oom" in text and "2.50" in text
    assert "unsupported" not in text
    md = to_markdown(bench_table(res))
    assert "| kerple | triton | 512 | 0.200 | 2.00 | 1.000 | 2.50 | 30 | 1.50 |" in md
    # a forward that ran another kernel than the backend's own (DAPE V2's Gluon forward) says so
    assert "| dapev2-kerple | triton (gluon fwd) | 512 | 2.000 | 20.00 |" in md
    assert "triton (gluon fwd)" in text


@pytest.mark.gpu
def test_run_bench_tiny(tmp_path):
    out = tmp_path / "bench.json"
    res = run_bench(methods=("sdpa", "kerple", "stickbreaking"), lengths=(256,), heads=2, head_dim=32,
                    backends=("sdpa", "triton", "chunked"), out_path=out, rep_ms=5, max_reps=3, commit="test",
                    log=None)
    saved = json.loads(out.read_text())
    assert saved["rows"] == res["rows"]
    assert saved["git_commit"] == "test" and saved["device"] == torch.cuda.get_device_name()
    ok = {(r["method"], r["backend"]) for r in saved["rows"] if r["status"] == "ok"}
    assert {("sdpa", "sdpa"), ("kerple", "triton"), ("stickbreaking", "triton"), ("kerple", "chunked")} <= ok
    assert all("fwdbwd_x_sdpa" in r for r in saved["rows"] if r["status"] == "ok")


def test_fox_rows_bind_the_gates_in_every_call():
    """FoX's bias reads the layer's input, which the kernel benchmark has not: its rows bind the bias
    to the prefix sums of a leaf of gate logits in each call, so the gates get their gradient (the
    cumsum backward is FoX's work too); other methods take no gates."""
    from torch.nn import functional as F

    from lenx.attention.backends import run_backend
    from lenx.ops.forgetting.reference import forgetting_reference

    assert _gate_logits(_parts("kerple", 2, 16, torch.device("cpu"), 4, 3)[0], 1, 2, 8, "cpu") is None
    parts, _ = _parts("fox", 2, 16, torch.device("cpu"), 4, 3)
    gate = _gate_logits(parts, 1, 2, 9, torch.device("cpu"))
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    out = run_backend("chunked", q, k, v, _bound(parts, gate))[0]
    c = F.logsigmoid(gate).cumsum(-1)
    torch.testing.assert_close(out, forgetting_reference(q, k, v, c))
    assert torch.autograd.grad(out.sum(), gate)[0].abs().sum() > 0


@pytest.mark.gpu
def test_run_bench_fox_beside_kerple():
    """The rows the issue's bar reads: fox and kerple on the fused kernels beside SDPA in one run."""
    res = run_bench(methods=("sdpa", "kerple", "fox"), lengths=(300,), heads=2, head_dim=64,
                    backends=("sdpa", "triton"), rep_ms=5, max_reps=3, commit="test", log=None)
    ok = {(r["method"], r["backend"]) for r in res["rows"] if r["status"] == "ok"}
    assert {("sdpa", "sdpa"), ("kerple", "triton"), ("fox", "triton")} <= ok
    fox = next(r for r in res["rows"] if r["method"] == "fox" and r["backend"] == "triton")
    assert fox["fwd_ms"] > 0 and fox["fwdbwd_ms"] > 0 and fox["fwd_kernel"] == "triton"
