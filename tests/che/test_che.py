"""The CHE protocol end to end (CPU smoke preset), and Proposition 1's hand-built recall model."""

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from lenx.attention import DapeV2, all_methods, parse_method
import lenx.che.protocol as che
from lenx.che.protocol import Encoder, make_config, merge_che, redraw_che, run_che, runs_causally
from lenx.ops import dape_v2_attention
from lenx.tasks import TASKS, sample_recall


def test_all_tasks_end_to_end(tmp_path):
    cfg = make_config("smoke", methods=["rope", "dapev2-kerple"], steps=3, test_max_length=44, test_length_step=3,
                      test_samples=8)
    result = run_che(cfg, tmp_path, progress=False)
    assert len(result["runs"]) == 15 * 2
    summary = json.loads((tmp_path / "che.json").read_text())["summary"]
    assert set(summary) == set(TASKS)
    for task in TASKS.values():
        for method in cfg.methods:
            r = summary[task.name][method]
            assert 0.0 <= r["mean"] <= r["max"] <= 1.0 and r["seeds"] == 1
    table = (tmp_path / "che.md").read_text()
    assert table.count("\n| ") == 16 and "| R | even_pairs | 50.0 |" in table
    assert (tmp_path / "che_per_length.png").stat().st_size > 20_000
    for run in result["runs"]:
        assert sorted(run["per_length"]) == [41, 44]
        assert run["git_commit"]  # each run records the code it ran


def test_summary_std_is_the_sample_std():
    runs = [{"task": "parity_check", "method": "rope", "accuracy": a} for a in (0.5, 0.7)]
    s = che.summarise(runs)["parity_check"]["rope"]
    assert abs(s["std"] - 0.1414213562373095) < 1e-12 and s["mean"] == 0.6 and s["seeds"] == 2
    assert che.summarise(runs[:1])["parity_check"]["rope"]["std"] == 0.0


def test_every_bidirectional_method_runs(tmp_path):
    methods = [m for m in all_methods() if not parse_method(m).causal_only]
    cfg = make_config("smoke", tasks=["parity_check"], methods=methods, steps=1, test_max_length=41,
                      test_samples=4, n_layer=1)
    result = run_che(cfg, tmp_path, progress=False)
    assert {r["method"] for r in result["runs"]} == set(methods)
    assert all(math.isfinite(r["final_train_loss"]) for r in result["runs"])


def test_directional_methods_run_causally(tmp_path):
    """Stick-breaking and CoPE run as causal encoders: an answer position (after the input) still
    sees the whole input, and changing the input's last token changes it."""
    cfg = make_config("smoke", tasks=["parity_check"], methods=["stickbreaking", "cope"], steps=2,
                      test_max_length=41, test_samples=4, n_layer=1)
    result = run_che(cfg, tmp_path, progress=False)
    assert {r["method"] for r in result["runs"]} == {"stickbreaking", "cope"}
    assert runs_causally("stickbreaking") and runs_causally("cope") and not runs_causally("dapev2-kerple")
    torch.manual_seed(0)
    model = Encoder("stickbreaking", 4, 2, cfg).eval()
    x = torch.randint(0, 3, (1, 12))
    y = x.clone()
    y[0, 5] = (y[0, 5] + 1) % 3
    out_x, out_y = model(x), model(y)
    assert torch.allclose(out_x[0, :5], out_y[0, :5])  # causal: positions before the change are untouched
    assert not torch.allclose(out_x[0, -1], out_y[0, -1])  # the last position reads the change


def test_bad_input():
    with pytest.raises(ValueError, match="parity_check"):
        run_che(make_config("smoke", tasks=["parity_chek"]), "/tmp/unused", progress=False)
    with pytest.raises(ValueError, match=">= 1"):
        make_config("smoke", test_min_length=0)


# --- resuming, merging, redrawing ----------------------------------------------------------------

def tiny(**overrides):
    base = dict(tasks=["parity_check"], methods=["nope"], seeds=[0], steps=3, test_max_length=45,
                test_samples=4, n_layer=1)
    return make_config("smoke", **{**base, **overrides})


def count_training(monkeypatch) -> list:
    """Record every (task, method, seed) that actually trains."""
    trained = []
    real = che.train_and_test

    def spy(task, method, seed, cfg, progress=None):
        trained.append((task, method, seed))
        return real(task, method, seed, cfg, progress)

    monkeypatch.setattr(che, "train_and_test", spy)
    return trained


def test_resume_trains_only_missing_runs(tmp_path, monkeypatch):
    trained = count_training(monkeypatch)
    first = run_che(tiny(), tmp_path, progress=False)
    assert trained == [("parity_check", "nope", 0)]
    run = first["runs"][0]
    assert run["test_time_s"] > 0 and run["train_time_s"] > 0 and run["protocol"]["steps"] == 3
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 1

    second = run_che(tiny(seeds=[0, 1]), tmp_path, progress=False)
    assert trained == [("parity_check", "nope", 0), ("parity_check", "nope", 1)]  # seed 0 was not retrained
    assert [r["seed"] for r in second["runs"]] == [0, 1]
    assert second["runs"][0]["accuracy"] == run["accuracy"]
    assert list(second["runs"][0]["per_length"]) == [41]  # read back from JSON with integer lengths again
    assert second["summary"]["parity_check"]["nope"]["seeds"] == 2
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 2
    assert json.loads((tmp_path / "che.json").read_text())["config"]["seeds"] == [0, 1]


def test_partial_last_line_is_ignored_and_repaired(tmp_path, monkeypatch):
    trained = count_training(monkeypatch)
    run_che(tiny(seeds=[0, 1]), tmp_path, progress=False)
    log = tmp_path / "runs.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text(lines[0] + lines[1][:40])  # killed while writing seed 1's line
    assert [r["seed"] for r in che.read_runs(log)] == [0]

    trained.clear()
    result = run_che(tiny(seeds=[0, 1]), tmp_path, progress=False)
    assert trained == [("parity_check", "nope", 1)]
    assert [r["seed"] for r in result["runs"]] == [0, 1]
    assert [json.loads(line)["seed"] for line in log.read_text().splitlines()] == [0, 1]  # the stub was cut off


def test_protocol_mismatch_refuses_to_resume(tmp_path, monkeypatch):
    trained = count_training(monkeypatch)
    run_che(tiny(), tmp_path, progress=False)
    with pytest.raises(ValueError, match="fresh --out") as err:
        run_che(tiny(steps=4, seeds=[1]), tmp_path, progress=False)
    assert "steps" in str(err.value)
    assert len(trained) == 1  # refused before training anything


def test_merge_gives_the_union(tmp_path):
    a = run_che(tiny(methods=["nope"]), tmp_path / "a", progress=False)
    b = run_che(tiny(methods=["alibi"], seeds=[0, 1]), tmp_path / "b", progress=False)
    (tmp_path / "b" / "che.json").unlink()  # b is unfinished: only its runs.jsonl is there
    merged = merge_che([tmp_path / "a", tmp_path / "b", tmp_path / "a"], tmp_path / "m")  # a twice: deduped
    assert [(r["method"], r["seed"]) for r in merged["runs"]] == [("nope", 0), ("alibi", 0), ("alibi", 1)]
    assert merged["config"]["methods"] == ["nope", "alibi"] and merged["config"]["seeds"] == [0, 1]
    assert merged["config"]["steps"] == 3 and merged["config"]["test_max_length"] == 45
    s = merged["summary"]["parity_check"]
    assert s["nope"]["seeds"] == 1 and s["alibi"]["seeds"] == 2
    assert s["nope"]["mean"] == a["summary"]["parity_check"]["nope"]["mean"]
    assert s["alibi"]["mean"] == pytest.approx(b["summary"]["parity_check"]["alibi"]["mean"])
    saved = json.loads((tmp_path / "m" / "che.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(merged["summary"]))
    assert "| nope | alibi |" in (tmp_path / "m" / "che.md").read_text()
    assert (tmp_path / "m" / "che_per_length.png").stat().st_size > 10_000

    run_che(tiny(steps=4), tmp_path / "c", progress=False)
    with pytest.raises(ValueError, match="different protocol"):
        merge_che([tmp_path / "a", tmp_path / "c"], tmp_path / "m2")
    with pytest.raises(ValueError, match="of its own"):  # would overwrite a training folder's results
        merge_che([tmp_path / "a"], tmp_path / "c")


def test_per_length_figure_title_fits(tmp_path, monkeypatch):
    """The figure's title stays inside the figure, even with one task (one panel, 5 inches wide)."""
    import matplotlib.pyplot as plt

    closed = []
    monkeypatch.setattr(plt, "close", closed.append)
    for tasks in (["parity_check"], list(TASKS)):
        runs = [{"task": t, "method": m, "per_length": {41: 0.5, 46: 0.6}, "protocol": {"train_max_length": 30}}
                for t in tasks for m in ("rope", "alibi")]
        che.plot_per_length(runs, tmp_path / "che.png")
        fig = closed[-1]
        box = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
        assert 0 <= box.x0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1, (len(tasks), box, fig.bbox)
        assert "lengths 1..30" in fig._suptitle.get_text()


def test_redraw_from_che_json_alone(tmp_path):
    run_che(tiny(), tmp_path / "run", progress=False)
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "che.json").write_text((tmp_path / "run" / "che.json").read_text())
    paths = redraw_che(copy / "che.json")
    assert paths == [copy / "che.md", copy / "che_per_length.png"]
    assert (copy / "che.md").read_text() == (tmp_path / "run" / "che.md").read_text()
    assert (copy / "che_per_length.png").stat().st_size > 10_000
    redraw_che(copy / "che.json", tmp_path / "elsewhere")
    assert (tmp_path / "elsewhere" / "che.md").exists()


def test_cli_merge_and_test_length_step(tmp_path):
    from typer.testing import CliRunner

    from lenx.cli import app

    runner = CliRunner()
    common = ["che", "--tasks", "parity_check", "--steps", "2", "--test-max-length", "47", "--test-samples", "4",
              "--no-progress"]
    for method in ("nope", "alibi"):
        out = runner.invoke(app, [*common, "--methods", method, "--test-length-step", "3",
                                  "--out", str(tmp_path / method)])
        assert out.exit_code == 0, out.output
    assert sorted(json.loads((tmp_path / "nope" / "che.json").read_text())["runs"][0]["per_length"]) == \
        ["41", "44", "47"]
    out = runner.invoke(app, ["che", "--merge", f"{tmp_path / 'nope'},{tmp_path / 'alibi'}",
                              "--out", str(tmp_path / "all")])
    assert out.exit_code == 0, out.output
    assert "| nope | alibi |" in out.output and "wrote" in out.output
    assert len(json.loads((tmp_path / "all" / "che.json").read_text())["runs"]) == 2
    out = runner.invoke(app, ["che", "--merge", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")])
    assert out.exit_code == 2 and "no CHE results" in out.output


def test_lenx_list_names_every_task_with_its_level():
    out = subprocess.run([sys.executable, "-m", "lenx", "list"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = {}
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in re.split("[│|]", line)]
        if len(cells) > 3 and cells[1] in TASKS:
            rows[cells[1]] = cells[2:]
    assert set(rows) == set(TASKS)
    for name, task in TASKS.items():
        level, chance = rows[name][:2]
        assert level == task.level and float(chance) == pytest.approx(task.chance, abs=1e-3), (name, rows[name])
    assert "rope" in out.stdout  # the methods table is still there
    out = subprocess.run([sys.executable, "-m", "lenx", "che", "--help"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "lenx list" in " ".join(out.stdout.split())  # wherever the help wraps


# --- Proposition 1: associative recall with no position encoding ----------------------------------

def shift_kernel_processor(num_heads=1) -> DapeV2:
    """A DapeV2 (no bias, H=1, D=2, k=3) whose f is the 1x2 key-axis kernel [-1, 1]:
    f(S)_ij = S_ij - S_i,j-1. conv1 makes +y and -y (y = S_ij - S_i,j-1); conv2 recombines them through
    the LeakyReLU: leaky(y) - leaky(-y) = 1.01 y, so it scales by 1/1.01."""
    proc = DapeV2(num_heads, hidden=2, kernel_size=3, with_bias=False).double()
    with torch.no_grad():
        proc.conv1.weight.zero_()
        proc.conv1.bias.zero_()
        proc.conv2.weight.zero_()
        proc.conv2.bias.zero_()
        # PyTorch convolution is cross-correlation: tap 0 reads key j-1, tap 1 key j, tap 2 key j+1.
        proc.conv1.weight[0, 0, 0] = torch.tensor([-1.0, 1.0, 0.0])
        proc.conv1.weight[1, 0, 0] = torch.tensor([1.0, -1.0, 0.0])
        proc.conv2.weight[0, 0, 0, 1] = 1 / 1.01
        proc.conv2.weight[0, 1, 0, 1] = -1 / 1.01
    return proc


def recall_attention(tokens: torch.Tensor, vocab: int, use_kernel: bool, sharpness: float = 40.0):
    """One attention layer, no position encoding. Embeddings are orthonormal (one-hot); W_Q = -I,
    W_K = I, so W_K^T W_Q = -I and S_ij = -sharpness * [x_i == x_j]. The processed score is then
    A = S + f(S) = 2 S_ij - S_i,j-1: +sharpness exactly where x_{j-1} == x_i (the token that followed the
    earlier occurrence of x_i), <= 0 elsewhere. Values are the embeddings, so the output at a repeated
    token is (nearly) the embedding of the token that followed it."""
    emb = torch.eye(vocab, dtype=torch.float64)[tokens][None, None]  # [1, 1, T, V]
    d = emb.shape[-1]
    q = -emb * sharpness * math.sqrt(d)
    k = emb
    if use_kernel:
        return dape_v2_attention(q, k, emb, shift_kernel_processor(), backend="dense")[0, 0]
    scores = (q @ k.transpose(-1, -2) / math.sqrt(d))[0, 0]
    T = len(tokens)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ emb[0, 0]


def test_hakuna_matata():
    """"Hakuna Matata ... Hakuna" -> the layer retrieves "Matata"."""
    vocab = {"hakuna": 0, "matata": 1, "it": 2, "means": 3, "no": 4, "worries": 5}
    words = ["hakuna", "matata", "it", "means", "no", "worries", "hakuna"]
    tokens = torch.tensor([vocab[w] for w in words])
    out = recall_attention(tokens, len(vocab), use_kernel=True)
    assert int(out[-1].argmax()) == vocab["matata"] and out[-1, vocab["matata"]] > 0.99
    # Without the kernel, plain NoPE attention cannot point at the *next* token: it avoids the match.
    plain = recall_attention(tokens, len(vocab), use_kernel=False)
    assert plain[-1, vocab["matata"]] < 0.5


def test_multi_query_recall_is_solved_by_the_construction():
    rng = np.random.default_rng(0)
    vocab = 64
    inputs, targets = sample_recall(8, n_pairs=10, n_queries=6, vocab_size=vocab, rng=rng)
    for row, target in zip(inputs, targets):
        out = recall_attention(row, vocab, use_kernel=True)
        scored = target != -100
        assert scored.sum() == 6
        assert torch.equal(out[scored].argmax(-1), target[scored])
