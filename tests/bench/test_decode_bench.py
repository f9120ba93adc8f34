"""The decoding benchmark (lenx.bench.decode, `lenx bench --decode`): its rows on the CPU with a tiny
preset (the code path a GPU runs, without the graph; the compiled step with inductor), transformers'
GPT-2 in the same run, a context that does not fit recorded as skipped, the CLI, and the whole
benchmark on a GPU."""

import json
import subprocess
import sys

import pytest
import torch

from lenx.bench.decode import GPT2, decode_bench
from lenx.config import ConfigError
from lenx.report.bench_tables import decode_table
from lenx.report.tables import to_markdown


def test_decode_bench_cpu(tmp_path):
    out = tmp_path / "decode.json"
    res = decode_bench(["rope", "dapev2-kerple"], [16, 40], [1, 2], preset="tiny", steps=2, warmup=1, repeats=2,
                       device="cpu", vocab_size=64, out_path=out, log=None)
    rows = res["rows"]
    assert {r["status"] for r in rows} == {"ok"}, rows
    keys = {(r["method"], r["mode"], r["context"], r["batch"]) for r in rows}
    assert len(keys) == len(rows) == (2 + 2 * 2) * 2 * 2  # GPT-2 and two methods, two modes each, 2 x 2 cells
    assert {r["mode"] for r in rows if r["method"] == GPT2} == {"eager", "static"}
    assert {r["mode"] for r in rows if r["method"] == "rope"} == {"eager", "static"}
    for r in rows:
        assert len(r["ms_runs"]) == 2 and r["ms_per_token"] == sorted(r["ms_runs"])[0] + (
            sorted(r["ms_runs"])[1] - sorted(r["ms_runs"])[0]) / 2  # the median of two runs
        assert r["tokens_per_s"] == pytest.approx(1000 * r["batch"] / r["ms_per_token"])
        static = next(g for g in rows if g["method"] == GPT2 and g["mode"] == "static"
                      and (g["context"], g["batch"]) == (r["context"], r["batch"]))
        assert r["x_gpt2"] == pytest.approx(r["ms_per_token"] / static["ms_per_token"])
        assert r["gpt2_reference"] == "static"
    saved = json.loads(out.read_text())
    assert saved["benchmark"] == "decode" and saved["torch"] == torch.__version__ and saved["transformers"]
    assert saved["settings"]["model"]["n_layer"] == 2 and saved["settings"]["precision"] == "fp32"
    assert saved["git_commit"] and saved["finished"] and len(saved["rows"]) == len(rows)
    md = to_markdown(decode_table(res))
    assert "| dapev2-kerple | static | 40 | 2 |" in md and "transformers" in md


def test_the_compiled_step_has_rows_on_the_cpu():
    """Mode compile (torch.compile with inductor on a CPU) beside eager: one compile per row."""
    res = decode_bench(["kerple"], [8], [1], preset="tiny", modes=["eager", "compile"], gpt2_modes=[], steps=2,
                       warmup=1, repeats=1, device="cpu", vocab_size=64, log=None)
    rows = {r["mode"]: r for r in res["rows"]}
    assert sorted(rows) == ["compile", "eager"] and {r["status"] for r in rows.values()} == {"ok"}, res["rows"]
    assert rows["compile"]["ms_per_token"] > 0 and res["settings"]["modes"] == ["eager", "compile"]


def test_a_context_that_does_not_fit_is_a_skipped_row(monkeypatch):
    from lenx.model import LM

    real = LM.new_cache

    def new_cache(self, batch, capacity, *args, **kwargs):
        if capacity > 100:  # as a GPU would say it
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.60 GiB")
        return real(self, batch, capacity, *args, **kwargs)

    monkeypatch.setattr(LM, "new_cache", new_cache)
    res = decode_bench(["kerple"], [16, 200], [1], preset="tiny", steps=2, warmup=0, repeats=1, device="cpu",
                       vocab_size=64, gpt2_modes=[], log=None)
    status = {(r["context"], r["mode"]): r["status"] for r in res["rows"]}
    assert status[(16, "eager")] == status[(16, "static")] == "ok"
    assert status[(200, "eager")].startswith("skipped: out of memory (OutOfMemoryError: CUDA out of memory")
    assert all(r["x_gpt2"] is None for r in res["rows"])  # no GPT-2 rows, no ratio


def test_bad_decode_settings_are_errors_before_any_timing():
    for kwargs, words in [({"modes": ["graph"]}, "needs a CUDA device"), ({"modes": ["fast"]}, "--modes"),
                          ({"gpt2_modes": ["graph"]}, "--gpt2-modes"), ({"methods": ["ropee"]}, "unknown method")]:
        args = {"methods": ["rope"], "contexts": [8], "batches": [1], "preset": "tiny", "device": "cpu"} | kwargs
        with pytest.raises(ValueError, match=words):
            decode_bench(**args, log=lambda line: pytest.fail(f"a row was timed: {line}"))
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        decode_bench(["rope"], [8], [1], preset="tiny", device="cpu", modes=["graph"])


def lenx(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600, cwd=cwd)


def test_decode_cli_cpu(tmp_path):
    proc = lenx("bench", "--decode", "--device", "cpu", "--preset", "tiny", "--methods", "kerple,stickbreaking",
                "--contexts", "12", "--batches", "1,3", "--steps", "2", "--warmup", "1", "--repeats", "1",
                "--gpt2-modes", "eager", "--commit", "test", "-o", "decode.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "decode.json").read_text())
    assert saved["git_commit"] == "test" and saved["settings"]["batches"] == [1, 3]
    assert saved["settings"]["gpt2_modes"] == ["eager"] and saved["settings"]["steps"] == 2
    assert [r["method"] for r in saved["rows"]][:2] == [GPT2, GPT2] and len(saved["rows"]) == 2 + 2 * 2 * 2
    assert "ms/token" in proc.stdout and "tokens/s" in proc.stdout and "wrote decode.json" in proc.stdout
    for bad, words in [(["--contexts", "8"], "apply to --decode"), (["--decode", "--train-step"], "one of them"),
                       (["--decode", "--batch", "2"], "--batches"), (["--decode", "--modes", "graph"], "CUDA"),
                       (["--decode", "--contexts", "0"], "--contexts"), (["--decode", "--gpt2-modes", ","], "nothing")]:
        proc = lenx("bench", "--device", "cpu", "--preset", "tiny", *bad, "-o", "bad.json", cwd=tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr
        assert not (tmp_path / "bad.json").exists()


@pytest.mark.gpu
def test_decode_bench_gpu(tmp_path):
    """Every lenx mode (eager, graph, compile with reduce-overhead) for every method family beside
    GPT-2's."""
    res = decode_bench(["rope", "kerple", "dapev2-kerple", "stickbreaking"], [256], [1, 2], preset="tiny", steps=4,
                       repeats=2, device="cuda", modes=["eager", "graph", "compile"], out_path=tmp_path / "d.json",
                       log=None)
    rows = res["rows"]
    assert {r["status"] for r in rows} == {"ok"}, [r["status"] for r in rows]
    assert {(r["method"], r["mode"]) for r in rows} >= {("rope", "graph"), ("dapev2-kerple", "graph"), (GPT2, "compile"),
                                                       ("rope", "compile"), ("stickbreaking", "compile")}
    assert all(r["x_gpt2"] is not None and r["peak_gib"] > 0 for r in rows)


@pytest.mark.parametrize("mode", ["eager", "static"])
def test_the_gpt2_step_decodes_with_its_context(mode):
    """The GPT-2 rows time a step that reads the prompt from the cache: its logits are the last row of
    a forward over prompt + token, not those of the token alone (transformers 5.17 ignored `cache=`:
    the argument's name differs between 5.x releases)."""
    pytest.importorskip("transformers")
    from lenx.bench.decode import _gpt2, _gpt2_step
    from lenx.config import load_config

    cfg = load_config("tiny", ["model.vocab_size=512"])
    model = _gpt2(cfg.model, 80, torch.device("cpu"))
    step = _gpt2_step(model, mode, 40, 1, 8, torch.device("cpu"), 512)
    prompt = torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(0))  # _gpt2_step's prompt
    token = torch.tensor([7])
    with torch.no_grad():
        got = step.forward(token)
        full = model(torch.cat([prompt, token[None]], 1)).logits[:, -1]
        alone = model(token[None]).logits[:, -1]
    torch.testing.assert_close(got, full, atol=1e-4, rtol=1e-4)
    assert (got - alone).abs().max() > 1e-2
