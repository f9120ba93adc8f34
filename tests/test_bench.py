"""The benchmark's table and ratios (CPU), and a tiny real run (GPU)."""

import io
import json

import pytest
import torch
from rich.console import Console

from lenx.bench import (_add_ratios, bench_markdown, print_bench_table, print_train_step_table, run_bench,
                        train_step_bench, train_step_markdown)


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
    print_bench_table(res, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "triton" in text and "oom" in text and "2.50" in text
    assert "unsupported" not in text
    md = bench_markdown(res)
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


# --- whole training steps (CPU) -------------------------------------------------------------------

def test_train_step_bench_cpu():
    res = train_step_bench(["rope", "dapev2-kerple"], preset="tiny", seq_len=16, batch_size=2, vocab_size=64,
                           steps=2, warmup=1, device="cpu", log=None)
    rows = {r["method"]: r for r in res["rows"]}
    assert set(rows) == {"rope", "dapev2-kerple"}
    assert rows["dapev2-kerple"]["ratio"] == 1.0  # the reference against itself
    rope = rows["rope"]
    assert len(rope["times_ms"]) == 2 and rope["median_ms"] > 0 and rope["peak_gib"] is None
    assert rope["ratio"] == pytest.approx(rope["median_ms"] / rows["dapev2-kerple"]["median_ms"])
    assert rope["tokens_per_s"] == pytest.approx(2 * 16 / (rope["median_ms"] / 1000))
    assert rope["backends"] == ["sdpa", "sdpa"] and rope["params"] > 0  # tiny: 2 layers
    assert res["settings"]["preset"] == "tiny" and res["torch"] == torch.__version__
    md = train_step_markdown(res)
    assert "| dapev2-kerple | chunked |" in md and "| 1.00 |" in md


def test_train_step_bench_failure_is_a_row_and_no_reference(monkeypatch):
    # a method that fails while it is timed (out of memory, say) fails alone: the others still run
    import lenx.bench as bench_module

    real = bench_module._train_step_row

    def row(method, *args):
        if method == "kerple":
            raise RuntimeError("the step failed")
        return real(method, *args)

    monkeypatch.setattr(bench_module, "_train_step_row", row)
    res = train_step_bench(["rope", "kerple"], preset="tiny", seq_len=8, batch_size=1, vocab_size=32, steps=1,
                           warmup=0, device="cpu", log=None)
    rows = {r["method"]: r for r in res["rows"]}
    assert "error" in rows["kerple"] and "median_ms" in rows["rope"]
    assert rows["rope"]["ratio"] is None  # dapev2-kerple was not measured
    buf = io.StringIO()
    print_train_step_table(res, Console(file=buf, width=200))
    assert "error" in buf.getvalue() and "rope" in buf.getvalue()


def test_train_step_forced_backends_are_checked_before_any_timing():
    """A forced backend that cannot run its method here, an unknown one, or one for a method not
    benchmarked is a ConfigError before the first model is built; a valid one is used by every layer."""
    from lenx.config import ConfigError

    def run(forced, log=None):
        return train_step_bench(["rope", "kerple"], preset="tiny", seq_len=8, batch_size=1, vocab_size=32, steps=1,
                                warmup=0, device="cpu", backend_overrides=forced, log=log)

    timed = []
    for forced, words in [({"kerple": "triton"}, "CUDA devices only"), ({"kerple": "nope"}, "unknown backend"),
                          ({"alibi": "dense"}, "not among the methods")]:
        with pytest.raises(ConfigError, match=words):
            run(forced, log=timed.append)
    assert timed == []  # nothing was timed
    res = run({"kerple": "dense"})
    rows = {r["method"]: r for r in res["rows"]}
    assert rows["kerple"]["backends"] == ["dense", "dense"] and rows["rope"]["backends"] == ["sdpa", "sdpa"]
    assert res["settings"]["backend_overrides"] == {"kerple": "dense"}


def test_train_step_cli_cpu(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "ts.json"
    proc = subprocess.run([sys.executable, "-m", "lenx", "bench", "--train-step", "--device", "cpu", "--preset", "tiny",
                           "--methods", "rope,dapev2-kerple", "--seq-len", "16", "--batch", "2", "--steps", "2",
                           "--warmup", "1", "--commit", "test", "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads(out.read_text())
    assert [r["method"] for r in saved["rows"]] == ["rope", "dapev2-kerple"]
    assert saved["rows"][1]["ratio"] == 1.0 and saved["git_commit"] == "test"
    assert saved["settings"]["batch_size"] == 2 and saved["settings"]["steps"] == 2
    assert "ms/step" in proc.stdout and "wrote" in proc.stdout
    # the kernel benchmark itself still refuses the CPU
    proc = subprocess.run([sys.executable, "-m", "lenx", "bench", "--device", "cpu"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--train-step" in proc.stderr
    # --backend-for: forced backends, from another working directory with a relative output path
    proc = subprocess.run([sys.executable, "-m", "lenx", "bench", "--train-step", "--device", "cpu", "--preset", "tiny",
                           "--methods", "kerple", "--seq-len", "8", "--batch", "1", "--steps", "1", "--warmup", "0",
                           "--backend-for", "kerple=dense", "-o", "forced.json"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "forced.json").read_text())["rows"][0]["backends"] == ["dense", "dense"]
    for bad, words in [("kerple=triton", "CUDA devices only"), ("kerple", "METHOD=BACKEND"),
                       ("kerple=dense,kerple=chunked", "twice")]:
        proc = subprocess.run([sys.executable, "-m", "lenx", "bench", "--train-step", "--device", "cpu", "--preset",
                               "tiny", "--methods", "kerple", "--backend-for", bad, "-o", "bad.json"],
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad.json").exists()
