"""The CHE protocol end to end (CPU smoke preset), and Proposition 1's hand-built recall model."""

import json
import math

import numpy as np
import pytest
import torch

from lenx.attention import DapeV2, all_methods, parse_method
from lenx.che import che_table, make_config, run_che
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


def test_every_bidirectional_method_runs(tmp_path):
    methods = [m for m in all_methods()
               if parse_method(m).normaliser == "softmax" and parse_method(m).base != "cope"]
    cfg = make_config("smoke", tasks=["parity_check"], methods=methods, steps=1, test_max_length=41,
                      test_samples=4, n_layer=1)
    result = run_che(cfg, tmp_path, progress=False)
    assert {r["method"] for r in result["runs"]} == set(methods)
    assert all(math.isfinite(r["final_train_loss"]) for r in result["runs"])


def test_bad_input():
    with pytest.raises(ValueError, match="non-causally"):
        run_che(make_config("smoke", methods=["stickbreaking"]), "/tmp/unused", progress=False)
    with pytest.raises(ValueError, match="parity_check"):
        run_che(make_config("smoke", tasks=["parity_chek"]), "/tmp/unused", progress=False)
    with pytest.raises(ValueError, match=">= 1"):
        make_config("smoke", test_min_length=0)


def test_table_reports_max_mean_std():
    summary = {"parity_check": {"rope": {"mean": 0.6, "std": 0.1, "max": 0.7, "seeds": 2}}}
    cfg = make_config("smoke", tasks=["parity_check"], methods=["rope"])
    assert "70.0 (60.0 ± 10.0)" in che_table(summary, cfg)


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
