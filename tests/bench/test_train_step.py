"""The training-step benchmark (lenx.bench.train_step, `lenx bench --train-step`): wall times,
profiled times and their ratios on the CPU, the CLI, and the attention's kernels on a GPU."""

import io
import json
import math

import pytest
import torch
from rich.console import Console

from lenx.bench.train_step import PROFILE_KEYS, _add_train_step_ratios, train_step_bench
from lenx.report.bench_tables import train_step_table
from lenx.report.tables import show, to_markdown


def test_train_step_bench_cpu():
    res = train_step_bench(["rope", "dapev2-kerple"], preset="tiny", seq_len=16, batch_size=2, vocab_size=64,
                           steps=2, warmup=1, device="cpu", profile_steps=0, log=None)
    rows = {r["method"]: r for r in res["rows"]}
    assert set(rows) == {"rope", "dapev2-kerple"}
    assert rows["dapev2-kerple"]["ratio"] == 1.0  # the reference against itself
    rope = rows["rope"]
    assert len(rope["times_ms"]) == 2 and rope["median_ms"] > 0 and rope["peak_gib"] is None
    assert rope["ratio"] == pytest.approx(rope["median_ms"] / rows["dapev2-kerple"]["median_ms"])
    assert rope["tokens_per_s"] == pytest.approx(2 * 16 / (rope["median_ms"] / 1000))
    assert rope["backends"] == ["sdpa", "sdpa"] and rope["params"] > 0  # tiny: 2 layers
    assert res["settings"]["preset"] == "tiny" and res["torch"] == torch.__version__
    # profile_steps=0: no profile, its keys present and None, as are the ratios built on them
    assert all(rope[k] is None for k in PROFILE_KEYS + ("attn_x_sdpa", "step_gpu_x_kerple", "wall_x_kerple"))
    assert res["sdpa_reference"] is None and res["profiled_time"] is None
    md = to_markdown(train_step_table(res))
    assert "| dapev2-kerple | chunked |" in md and "no torch.profiler figures" in md


def test_train_step_bench_profiles_attention_cpu():
    """The profiled figures on a CPU (CPU op self time, the same code as on a GPU): present, finite,
    consistent, every layer's attention found in every profiled step, and the ratios."""
    res = train_step_bench(["sdpa", "kerple", "dapev2-kerple"], preset="tiny", seq_len=16, batch_size=2,
                           vocab_size=64, steps=1, warmup=1, device="cpu", profile_steps=2, log=None)
    rows = {r["method"]: r for r in res["rows"]}
    assert res["sdpa_reference"] == "sdpa" and res["settings"]["profile_steps"] == 2
    assert "CPU op self time" in res["profiled_time"]
    for r in rows.values():
        assert all(r[k] is not None for k in PROFILE_KEYS), r
        assert all(math.isfinite(r[k]) for k in ("step_gpu_ms", "attn_fwd_gpu_ms", "attn_bwd_gpu_ms", "attn_gpu_ms"))
        assert 0 < r["attn_fwd_gpu_ms"] and 0 < r["attn_bwd_gpu_ms"] and r["attn_gpu_ms"] < r["step_gpu_ms"]
        assert r["attn_gpu_ms"] == pytest.approx(r["attn_fwd_gpu_ms"] + r["attn_bwd_gpu_ms"])
        assert r["attn_ranges_per_step"] == {"fwd": 2, "bwd": 2}  # tiny: 2 layers
        assert r["unlinked_gpu_ms"] == 0
        kernels = r["attn_kernels"]
        assert 0 < len(kernels) <= 12 and {k["pass"] for k in kernels} <= {"fwd", "bwd"}
        assert [k["ms_per_step"] for k in kernels] == sorted((k["ms_per_step"] for k in kernels), reverse=True)
        assert sum(k["ms_per_step"] for k in kernels) <= r["attn_gpu_ms"] * (1 + 1e-9)
        assert r["attn_x_sdpa"] == pytest.approx(r["attn_gpu_ms"] / rows["sdpa"]["attn_gpu_ms"])
        assert r["step_gpu_x_kerple"] == pytest.approx(r["step_gpu_ms"] / rows["kerple"]["step_gpu_ms"])
        assert r["wall_x_kerple"] == pytest.approx(r["median_ms"] / rows["kerple"]["median_ms"])
    assert rows["sdpa"]["attn_x_sdpa"] == 1.0 and rows["kerple"]["step_gpu_x_kerple"] == 1.0
    assert any("scaled_dot_product" in k["name"] for k in rows["sdpa"]["attn_kernels"])
    buf = io.StringIO()
    show([train_step_table(res)], Console(file=buf, width=250))
    text = buf.getvalue()
    assert "GPU times from torch.profiler kernel time" in text and "host-bound" in text and "CPU op self time" in text
    md = to_markdown(train_step_table(res))
    assert "| method | backend(s) | wall ms/step | step GPU ms | x Kerple (GPU) | attn GPU ms (fwd+bwd) | X vs SDPA |" in md
    assert "| sdpa | sdpa |" in md and "| 1.00 |" in md


def test_train_step_ratios():
    """_add_train_step_ratios on made-up rows: wall and step GPU time over Kerple's, attention GPU time
    over SDPA's (rope's when no sdpa row ran on SDPA alone), wall over the reference's."""
    def row(method, backends, median, step_gpu, attn):
        return {"method": method, "backends": backends, "median_ms": median, "step_gpu_ms": step_gpu,
                "attn_gpu_ms": attn}

    res = {"rows": [row("sdpa", ["sdpa"] * 2, 8.0, 4.0, 0.5), row("rope", ["sdpa"] * 2, 9.0, 4.5, 0.6),
                    row("kerple", ["triton"] * 2, 10.0, 5.0, 1.0), row("dapev2-kerple", ["triton"] * 2, 20.0, 12.5, 4.0),
                    {"method": "fire", "status": "oom", "error": "OutOfMemoryError: ..."}]}
    _add_train_step_ratios(res, "dapev2-kerple")
    rows = {r["method"]: r for r in res["rows"]}
    assert res["sdpa_reference"] == "sdpa"
    d = rows["dapev2-kerple"]
    assert d["attn_x_sdpa"] == pytest.approx(8.0) and d["step_gpu_x_kerple"] == pytest.approx(2.5)
    assert d["wall_x_kerple"] == pytest.approx(2.0) and d["ratio"] == 1.0
    assert rows["sdpa"]["ratio"] == pytest.approx(0.4) and rows["kerple"]["attn_x_sdpa"] == pytest.approx(2.0)
    assert all(rows["fire"][k] is None for k in ("ratio", "attn_x_sdpa", "step_gpu_x_kerple", "wall_x_kerple"))
    # sdpa forced onto another backend is no SDPA reference: rope's attention is; no kerple row: no x kerple
    res["rows"][0]["backends"] = ["dense"] * 2
    del res["rows"][2]
    _add_train_step_ratios(res, "dapev2-kerple")
    assert res["sdpa_reference"] == "rope"
    assert rows["dapev2-kerple"]["attn_x_sdpa"] == pytest.approx(4.0 / 0.6)
    assert rows["dapev2-kerple"]["step_gpu_x_kerple"] is None and rows["dapev2-kerple"]["wall_x_kerple"] is None


def test_train_step_bench_failure_is_a_row_and_no_reference(monkeypatch):
    # a method that fails while it is timed (out of memory, say) fails alone: the others still run
    import lenx.bench.train_step as bench_module

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
    assert rows["rope"]["wall_x_kerple"] is None  # nor was kerple
    buf = io.StringIO()
    show([train_step_table(res)], Console(file=buf, width=200))
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
    with pytest.raises(ConfigError, match="profile_steps must be 0"):
        train_step_bench(["rope"], preset="tiny", device="cpu", profile_steps=-1, log=timed.append)
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
                           "--warmup", "1", "--profile-steps", "0", "--commit", "test", "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads(out.read_text())
    assert [r["method"] for r in saved["rows"]] == ["rope", "dapev2-kerple"]
    assert saved["rows"][1]["ratio"] == 1.0 and saved["git_commit"] == "test"
    assert saved["settings"]["batch_size"] == 2 and saved["settings"]["steps"] == 2
    assert saved["rows"][0]["step_gpu_ms"] is None  # --profile-steps 0
    assert "ms/step" in proc.stdout and "wrote" in proc.stdout
    # the kernel benchmark itself still refuses the CPU
    proc = subprocess.run([sys.executable, "-m", "lenx", "bench", "--device", "cpu"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--train-step" in proc.stderr
    # --backend-for: forced backends, from another working directory with a relative output path
    # and --profile-steps: the attention's profiled time, against sdpa's
    proc = subprocess.run([sys.executable, "-m", "lenx", "bench", "--train-step", "--device", "cpu", "--preset", "tiny",
                           "--methods", "sdpa,kerple", "--seq-len", "8", "--batch", "1", "--steps", "1", "--warmup", "0",
                           "--profile-steps", "1", "--backend-for", "kerple=dense", "-o", "forced.json"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "forced.json").read_text())
    sdpa, kerple = saved["rows"]
    assert kerple["backends"] == ["dense", "dense"] and saved["settings"]["profile_steps"] == 1
    assert saved["sdpa_reference"] == "sdpa" and sdpa["attn_x_sdpa"] == 1.0 and kerple["step_gpu_x_kerple"] == 1.0
    assert kerple["attn_x_sdpa"] == pytest.approx(kerple["attn_gpu_ms"] / sdpa["attn_gpu_ms"])
    assert 0 < kerple["attn_gpu_ms"] < kerple["step_gpu_ms"] and kerple["attn_ranges_per_step"] == {"fwd": 2, "bwd": 2}
    assert "torch.profiler kernel time" in proc.stdout and "host-bound" in proc.stdout
    for bad, words in [("kerple=triton", "CUDA devices only"), ("kerple", "METHOD=BACKEND"),
                       ("kerple=dense,kerple=chunked", "twice")]:
        proc = subprocess.run([sys.executable, "-m", "lenx", "bench", "--train-step", "--device", "cpu", "--preset",
                               "tiny", "--methods", "kerple", "--backend-for", bad, "-o", "bad.json"],
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad.json").exists()


@pytest.mark.gpu
def test_train_step_bench_profiles_attention_kernels_gpu():
    """On the GPU: the attention's kernels (forward and backward, every layer) are found in the
    profile, are part of the step's kernels, and are attention kernels (SDPA's flash / cuDNN / memory-
    efficient kernels; lenx's Triton kernels for Kerple), never the MLP's or LayerNorm's."""
    import re

    res = train_step_bench(["sdpa", "kerple"], preset="tiny", seq_len=256, batch_size=4, vocab_size=256, steps=2,
                           warmup=2, device="cuda", profile_steps=2, log=None)
    rows = {r["method"]: r for r in res["rows"]}
    assert res["sdpa_reference"] == "sdpa" and "GPU kernel time" in res["profiled_time"]
    attention = re.compile(r"flash|fmha|attention|sdpa|cudnn|softmax|_bias_|_band_", re.IGNORECASE)
    for method, r in rows.items():
        assert "error" not in r, r
        assert 0 < r["attn_gpu_ms"] < r["step_gpu_ms"] and r["attn_fwd_gpu_ms"] > 0 and r["attn_bwd_gpu_ms"] > 0
        assert r["attn_ranges_per_step"] == {"fwd": 2, "bwd": 2}
        assert r["unlinked_gpu_ms"] < 0.05 * r["step_gpu_ms"], r["unlinked_gpu_ms"]
        names = [k["name"] for k in r["attn_kernels"]]
        assert {k["pass"] for k in r["attn_kernels"]} == {"fwd", "bwd"}
        assert any(attention.search(n) for n in names[:3]), (method, names)  # among the biggest
        assert not any(re.search(r"gelu|layer_norm|nll_loss|adam", n, re.IGNORECASE) for n in names), names
    assert rows["sdpa"]["attn_x_sdpa"] == 1.0 and rows["kerple"]["attn_x_sdpa"] > 0


def test_train_step_top_kernels_cpu(tmp_path):
    """top_kernels / --top-kernels: each row's costliest work outside the attention's ranges, sorted,
    within other_gpu_ms (= the step less the attention), and its table; bad values are refused first."""
    import subprocess
    import sys

    from lenx.config import ConfigError
    from lenx.report.bench_tables import other_kernels_table

    res = train_step_bench(["rope", "kerple"], preset="tiny", seq_len=16, batch_size=2, vocab_size=64, steps=1,
                           warmup=1, device="cpu", profile_steps=1, top_kernels=3, log=None)
    assert res["settings"]["top_kernels"] == 3
    for r in res["rows"]:
        top = r["other_kernels"]
        assert len(top) == 3 and {k["pass"] for k in top} == {"-"}  # a CPU: one thread for both passes
        assert [k["ms_per_step"] for k in top] == sorted((k["ms_per_step"] for k in top), reverse=True)
        assert r["other_gpu_ms"] == pytest.approx(r["step_gpu_ms"] - r["attn_gpu_ms"])
        assert 0 < sum(k["ms_per_step"] for k in top) <= r["other_gpu_ms"] * (1 + 1e-9)
        assert all(k["calls_per_step"] >= 1 for k in top)
    md = to_markdown(other_kernels_table(res))
    assert "| rope | - |" in md and "| kerple | - |" in md and "the rest of other_gpu_ms" in md
    plain = train_step_bench(["rope"], preset="tiny", seq_len=8, batch_size=1, vocab_size=64, steps=1, warmup=0,
                             device="cpu", profile_steps=1, log=None)
    assert "other_kernels" not in plain["rows"][0] and plain["rows"][0]["other_gpu_ms"] > 0
    with pytest.raises(ConfigError, match="profile_steps > 0"):
        train_step_bench(["rope"], preset="tiny", device="cpu", profile_steps=0, top_kernels=2, log=None)
    # the CLI, from another working directory with a relative output
    base = [sys.executable, "-m", "lenx", "bench", "--device", "cpu", "--preset", "tiny", "--methods", "rope",
            "--seq-len", "8", "--batch", "1", "--steps", "1", "--warmup", "0"]
    proc = subprocess.run(base + ["--train-step", "--profile-steps", "1", "--top-kernels", "2", "-o", "top.json"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads((tmp_path / "top.json").read_text())["rows"][0]["other_kernels"]) == 2
    assert "kernels outside the attention" in proc.stdout
    for extra, words in [(["--top-kernels", "2"], "applies to --train-step"),
                         (["--train-step", "--top-kernels", "2", "--profile-steps", "0"], "--profile-steps of 1"),
                         (["--train-step", "--top-kernels", "-1"], "number of kernels >= 0")]:
        proc = subprocess.run(base + extra + ["-o", "bad.json"], capture_output=True, text=True, timeout=600,
                              cwd=tmp_path)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad.json").exists()


@pytest.mark.gpu
def test_train_step_top_kernels_gpu():
    """On the GPU the kernels outside the attention split by pass (the autograd thread's are bwd), and
    RoPE's fused rotation is among them, forward and backward, once per layer each way."""
    res = train_step_bench(["rope"], preset="tiny", seq_len=256, batch_size=4, vocab_size=256, steps=1, warmup=2,
                           device="cuda", profile_steps=2, top_kernels=100, log=None)
    top = res["rows"][0]["other_kernels"]
    assert {k["pass"] for k in top} >= {"fwd", "bwd"}, top
    rotations = {k["pass"]: k["calls_per_step"] for k in top if k["name"] == "_rotate_qk"}
    assert rotations == {"fwd": 2, "bwd": 2}, top  # tiny: 2 layers
