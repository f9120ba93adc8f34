"""`lenx eval RUN --task <suite tasks>` the way a user runs it: from another folder, relative paths."""

import json

from test_nothing_lost import lenx, ok, one_line_error


def test_eval_suite_tasks_writes_the_grid(work):
    out = ok(lenx("eval", "../runs/r", "--task", "niah_single,qa1", "--lengths", "160", "--depths", "0,1",
                  "--samples", "1", "--device", "cpu", cwd=work / "elsewhere"))
    result = json.loads((work / "runs" / "r" / "eval_niah_single+qa1.json").read_text())
    assert "eval_niah_single+qa1.json" in out.stdout and "niah_single" in out.stdout
    assert set(result["tasks"]) == {"niah_single", "qa1"} and result["lengths"] == [160]
    for r in result["tasks"].values():
        assert len(r["exact"]) == 1 and len(r["exact"][0]) == 2 and all(v < 0 for v in r["logprob"][0])
    assert result["corpus_fingerprint"]["test"] and result["generator_version"]["babilong"] == 1


def test_eval_suite_bad_input_is_one_line(work):
    one_line_error(lenx("eval", "../runs/r", "--task", "qa1,nope", "--device", "cpu", cwd=work / "elsewhere"),
                   "nope")
    one_line_error(lenx("eval", "../runs/r", "--task", "ruler", "--lengths", "20", "--device", "cpu",
                        cwd=work / "elsewhere"), "minimum")
    one_line_error(lenx("eval", "../runs/r", "--task", "babilong", "--lengths", "99999999", "--device", "cpu",
                        cwd=work / "elsewhere"), "tokens")
    assert not list((work / "runs" / "r").glob("eval_ruler*")) and not list((work / "runs" / "r").glob("eval_bab*"))


def test_plot_draws_a_heatmap_per_suite_task(work, tmp_path):
    ok(lenx("eval", "../runs/r", "--task", "vt,qa2", "--lengths", "192,256", "--depths", "0.5", "--samples", "1",
            "--device", "cpu", cwd=work / "elsewhere"))
    ok(lenx("plot", str(work / "runs" / "r"), "-o", str(tmp_path / "figs"), cwd=work / "elsewhere"))
    names = {p.name for p in (tmp_path / "figs").iterdir()}
    assert {"eval_vt+qa2_vt_heatmap.png", "eval_vt+qa2_qa2_heatmap.png"} <= names, names


def test_a_cell_that_would_not_fit_refuses_before_the_model_loads(work, monkeypatch):
    import pytest

    from lenx.config import ConfigError
    from lenx.evaluation import suite_eval
    from lenx.model import memory

    monkeypatch.setattr(memory, "available_memory", lambda device: 1000)   # a machine with 1 kB free
    monkeypatch.setattr(suite_eval, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ConfigError, match="suite at length 192 needs about"):
        suite_eval.evaluate_suite(work / "runs" / "r", "qa1", lengths=[192], samples=1, device="cpu", progress=False)


def test_a_token_level_run_gets_the_token_level_suite(tmp_path):
    """A run trained on the synthetic corpus (ids, no text): the RULER-style tasks run on token
    sequences; the BABILong-style ones are refused in one line before the model loads."""
    sets = [a for s in ("model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=32",
                        "train.batch_size=4", "train.steps=2", "train.device=cpu") for a in ("--set", s)]
    (tmp_path / "elsewhere").mkdir()
    ok(lenx("train", "-c", "tiny", *sets, "-o", "runs/s", "--no-progress", cwd=tmp_path))
    out = ok(lenx("eval", "../runs/s", "--task", "niah_multiquery,fwe", "--lengths", "200", "--depths", "0.5",
                  "--samples", "1", "--device", "cpu", cwd=tmp_path / "elsewhere"))
    result = json.loads((tmp_path / "runs" / "s" / "eval_niah_multiquery+fwe.json").read_text())
    assert "eval_niah_multiquery+fwe.json" in out.stdout and result["generator_version"] == {"ruler_tokens": 1}
    assert result["tasks"]["fwe"]["chance"] == 1 / 8 and result["tasks"]["niah_multiquery"]["logprob"][0][0] < 0
    one_line_error(lenx("eval", "../runs/s", "--task", "vt,qa1", "--lengths", "200", "--device", "cpu",
                        cwd=tmp_path / "elsewhere"), "qa1 task is reasoning over sentences", "token-level")
    assert not (tmp_path / "runs" / "s" / "eval_vt+qa1.json").exists()
    one_line_error(lenx("suite-export", "../tasks", "--like", "../runs/s", "--task", "vt",
                        cwd=tmp_path / "elsewhere"), "token-level")
