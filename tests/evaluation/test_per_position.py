"""Per-position loss (`lenx eval --per-position`, eval.per_position): the bins, the same NLL as the
perplexity windows, and the CLI as a user runs it (eval, compare, plot; an old eval.json without it)."""

import json
import math
import shutil

import numpy as np
import pytest

from test_nothing_lost import copy_work, lenx, ok, one_line_error


def test_log_edges_and_bin_means_on_a_hand_built_array():
    from lenx.evaluation.positions import bin_means, log_edges, per_position

    assert log_edges(8) == [0, 1, 2, 3, 4, 5, 6, 8]
    assert log_edges(64) == [0, 1, 2, 3, 4, 5, 6, 8, 9, 11, 13, 16, 19, 22, 26, 32, 38, 45, 53, 64]
    assert log_edges(1) == [0, 1] and log_edges(100)[-2:] == [90, 100]
    nll = np.stack([np.arange(8.0), 10 * np.arange(8.0)])  # window 0: NLL p at position p; window 1: 10 p
    means = bin_means(nll, log_edges(8))
    assert means.shape == (7, 2)
    assert means[:, 0].tolist() == [0, 1, 2, 3, 4, 5, 6.5] and means[-1, 1] == 65
    entry = per_position(nll)
    assert entry["edges"] == [0, 1, 2, 3, 4, 5, 6, 8] and entry["from_length"] == 8
    assert entry["nll"][-1] == pytest.approx((6.5 + 65) / 2) and entry["window_nll"][-1] == [6.5, 65.0]
    with pytest.raises(ValueError, match=r"\[windows, 8\]"):
        bin_means(np.zeros((2, 7)), log_edges(8))


def test_per_position_is_the_perplexity_windows_nll(work):
    """The bins come from the longest length's forward: its scored tokens (the last 32 of 64, bins
    32..64) give the very window NLLs of the perplexity, all positions its full-sequence NLL; and a
    float64 forward of the same windows gives the same bins."""
    import torch

    from lenx.evaluation.evaluate import eval_windows_with_documents, token_nll
    from lenx.evaluation.positions import bin_means
    from lenx.runs import load_model, open_run_corpus, run_config, run_weights

    run = work / "runs" / "r"
    result = __import__("lenx.evaluation.evaluate", fromlist=["evaluate"]).evaluate(
        run, lengths=[32, 64], scored=32, device="cpu", progress=False, write=False, per_position=True)
    pp = result["per_position"]
    edges, rows = pp["edges"], np.array(pp["window_nll"])
    widths = np.diff(edges)[:, None]
    late = np.array(edges[:-1]) >= 32
    scored = (rows[late] * widths[late]).sum(0) / 32
    assert scored == pytest.approx(result["results"]["64"]["window_nll"], abs=2e-6)
    assert (rows * widths).sum() / 64 / rows.shape[1] == pytest.approx(math.log(result["results"]["64"]["ppl_full"]),
                                                                       rel=1e-6)

    cfg = run_config(run)
    model = load_model(cfg, run_weights(run), torch.device("cpu"), None).double()
    data, _, _ = eval_windows_with_documents(open_run_corpus(run, cfg), cfg.eval.split, 64, cfg.eval.windows,
                                             cfg.eval.seed)
    x = torch.from_numpy(data)
    with torch.no_grad():
        exact = token_nll(model, x[:, :-1], x[:, 1:], 64).double().numpy()
    assert np.abs(bin_means(exact, edges) - rows).max() < 1e-4  # fp32 evaluation against float64


def test_eval_compare_and_plot_per_position_from_another_folder(work, tmp_path):
    w = copy_work(work, tmp_path / "w")
    out = ok(lenx("eval", "../runs/r", "--lengths", "32,64", "--per-position", "--device", "cpu", cwd=w / "elsewhere"))
    result = json.loads((w / "runs" / "r" / "eval.json").read_text())
    assert f"per-position NLL: {len(result['per_position']['nll'])} bins of positions 0-63" in out.stdout
    pp = result["per_position"]
    assert pp["edges"][0] == 0 and pp["edges"][-1] == 64 and 32 in pp["edges"] and pp["from_length"] == 64
    assert len(pp["nll"]) == len(pp["edges"]) - 1 == len(pp["window_nll"])
    assert all(len(r) == result["windows"] for r in pp["window_nll"])
    # an older eval.json (no per_position) beside it: another method, as an old run would be
    old = w / "runs" / "old"
    shutil.copytree(w / "runs" / "r", old)
    legacy = {k: v for k, v in result.items() if k != "per_position"} | {"method": "legacy"}
    (old / "eval.json").write_text(json.dumps(legacy))

    out = ok(lenx("compare", "../runs", "-o", "cmp.json", "--resamples", "200", cwd=w / "elsewhere"))
    assert "cmp_per_position.png" in out.stdout
    assert (w / "elsewhere" / "cmp_per_position.png").stat().st_size > 0
    compared = json.loads((w / "elsewhere" / "cmp.json").read_text())
    curve = compared["per_position"][result["method"]]
    assert curve["edges"] == pp["edges"] and curve["train_len"] == 32
    assert curve["covers"] == compared["methods"][result["method"]]["lengths"]["64"]["covers"]  # one seed
    for value, lo, hi in zip(curve["nll"], curve["lo"], curve["hi"]):
        assert lo <= value <= hi
    assert curve["nll"] == pytest.approx(pp["nll"], abs=1e-5)
    assert "per-position" in compared["per_position"]["legacy"]["note"]

    ok(lenx("plot", "../runs", "-o", "figs", cwd=w / "elsewhere"))
    assert (w / "elsewhere" / "figs" / "per_position.png").stat().st_size > 0
    ok(lenx("plot", "../runs/r/eval.json", "-o", "one", cwd=w / "elsewhere"))
    assert (w / "elsewhere" / "one" / "per_position.png").stat().st_size > 0
    ok(lenx("plot", "cmp.json", "-o", "again", cwd=w / "elsewhere"))
    assert (w / "elsewhere" / "again" / "cmp_per_position.png").stat().st_size > 0

    # the old eval.json alone still compares and plots, with no per-position anywhere
    ok(lenx("compare", "../runs/old", "-o", "old.json", "--resamples", "200", cwd=w / "elsewhere"))
    assert "per_position" not in json.loads((w / "elsewhere" / "old.json").read_text())
    assert not (w / "elsewhere" / "old_per_position.png").exists()
    ok(lenx("plot", "../runs/old", "-o", "oldfigs", cwd=w / "elsewhere"))
    assert not (w / "elsewhere" / "oldfigs" / "per_position.png").exists()


def test_the_config_key_and_the_flag(work, tmp_path):
    w = copy_work(work, tmp_path / "w")
    config = w / "runs" / "r" / "config.toml"
    assert "per_position = false" in config.read_text()  # every run's config names the key
    config.write_text(config.read_text().replace("per_position = false", "per_position = true"))
    ok(lenx("eval", "../runs/r", "--lengths", "32,64", "--device", "cpu", cwd=w / "elsewhere"))
    assert "per_position" in json.loads((w / "runs" / "r" / "eval.json").read_text())
    ok(lenx("eval", "../runs/r", "--lengths", "32,64", "--no-per-position", "--device", "cpu", cwd=w / "elsewhere"))
    assert "per_position" not in json.loads((w / "runs" / "r" / "eval.json").read_text())
    # the evaluation with the bins is another one: kept beside the new eval.json, not lost
    kept = [json.loads(p.read_text()) for p in (w / "runs" / "r").glob("eval.*.json")]
    assert any("per_position" in k for k in kept)
    one_line_error(lenx("eval", "../runs/r", "--task", "passkey", "--per-position", "--device", "cpu",
                        cwd=w / "elsewhere"), "--per-position")
    one_line_error(lenx("train", "-c", "tiny", "--set", "eval.per_position=3", cwd=w / "elsewhere"),
                   "eval.per_position")


def test_a_malformed_per_position_is_one_line(work, tmp_path):
    w = copy_work(work, tmp_path / "w")
    path = w / "runs" / "r" / "eval.json"
    result = json.loads(path.read_text())
    path.write_text(json.dumps(result | {"per_position": {"edges": [0, 1, 64], "window_nll": [[1.0]]}}))
    one_line_error(lenx("compare", "../runs/r", "-o", "c.json", cwd=w / "elsewhere"), "per_position")
    one_line_error(lenx("plot", "../runs/r", "-o", "f", cwd=w / "elsewhere"), "per_position")


def test_eval_hf_per_position(tmp_path):
    """`lenx eval --hf DIR --per-position`: the same bins of the model's tokens; with the corpus's
    tokenizer they are lenx's corpus tokens and the scored ones give its window NLLs."""
    from hf_helpers import corpus_texts, corpus_tokenizer, gpt2_folder, llama_folder, own_tokenizer, text_corpus

    corpus = text_corpus(tmp_path / "data", "words")
    llama_folder(tmp_path / "llama", corpus_tokenizer(corpus))
    gpt2_folder(tmp_path / "gpt2", own_tokenizer(corpus_texts(corpus)))
    (tmp_path / "elsewhere").mkdir()
    common = ["--corpus", "words", "--data-root", "../data", "--lengths", "32,64", "--scored", "32", "--windows", "4",
              "--train-len", "32", "--device", "cpu", "--per-position", "--no-progress"]
    ok(lenx("eval", "--hf", "../llama", "-o", "../evals/llama", *common, cwd=tmp_path / "elsewhere"))
    result = json.loads((tmp_path / "evals" / "llama" / "eval.json").read_text())
    pp = result["per_position"]
    assert pp["unit"] == "corpus tokens" and pp["edges"][-1] == 64
    rows, widths = np.array(pp["window_nll"]), np.diff(pp["edges"])[:, None]
    late = np.array(pp["edges"][:-1]) >= 32
    assert (rows[late] * widths[late]).sum(0) / 32 == pytest.approx(result["results"]["64"]["window_nll"], abs=2e-6)
    ok(lenx("eval", "--hf", "../gpt2", "-o", "../evals/gpt2", *common, cwd=tmp_path / "elsewhere"))
    other = json.loads((tmp_path / "evals" / "gpt2" / "eval.json").read_text())["per_position"]
    assert other["unit"] == "model tokens" and len(other["window_nll"][0]) == 4
    ok(lenx("compare", "../evals", "-o", "c.json", "--resamples", "200", cwd=tmp_path / "elsewhere"))
    assert set(json.loads((tmp_path / "elsewhere" / "c.json").read_text())["per_position"]) == {"llama", "gpt2"}
    one_line_error(lenx("eval", "--hf", "../llama", "-o", "../evals/x", "--corpus", "words", "--data-root", "../data",
                        "--task", "passkey", "--per-position", cwd=tmp_path / "elsewhere"), "--per-position")


def test_a_sweep_evaluates_again_when_the_config_asks_for_the_bins(work, tmp_path):
    from lenx.evaluation.evaluate import evaluate
    from lenx.training.sweep import _run_state

    w = copy_work(work, tmp_path / "w")
    run = w / "runs" / "r"
    assert _run_state(run, None) == "done"
    config = run / "config.toml"
    config.write_text(config.read_text().replace("per_position = false", "per_position = true"))
    assert _run_state(run, None) == "trained"  # its eval.json has no bins: evaluated again
    evaluate(run, device="cpu", progress=False)
    assert "per_position" in json.loads((run / "eval.json").read_text()) and _run_state(run, None) == "done"
