"""The tables of `lenx eval` and `lenx sweep`: training length marked, seeds as mean ± std, the
retrieval grid, a sweep's results.md."""

from helpers import eval_result
from lenx.report.eval_tables import eval_table, sweep_markdown, task_table


def test_table_marks_the_training_length():
    table = eval_table([eval_result("rope", {64: 8.22, 128: 8.35}, {128: -0.18}),
                        eval_result("kerple", {64: 6.92, 128: 6.93}, {128: 0.04})])
    assert [c.name for c in table.columns] == ["method", "64 (train)", "128"]
    assert [c.justify for c in table.columns] == ["left", "right", "right"]
    assert table.rows == [["rope", "8.22", "8.35 (-0.18)"], ["kerple", "6.92", "6.93 (+0.04)"]]
    assert "seeds" not in table.title


def test_table_over_seeds_shows_mean_and_sample_std():
    results = [eval_result("rope", {64: 8.0, 128: 9.0}, {128: -1.0}, seed=0),
               eval_result("rope", {64: 10.0, 128: 11.0}, {128: 1.0}, seed=1),
               eval_result("rope", {64: 12.0, 128: 13.0}, {128: 3.0}, seed=2),
               eval_result("kerple", {64: 7.0, 128: 7.0}, {128: 0.5}, seed=0),
               eval_result("kerple", {64: 7.5, 128: 7.0}, {128: 0.5}, seed=1),
               eval_result("kerple", {64: 8.0, 128: 7.0}, {128: 0.5}, seed=2)]
    table = eval_table(results)
    assert "mean ± sample std over 3 seeds" in table.title
    assert table.rows == [["rope", "10.00 ± 2.00", "11.00 ± 2.00 (+1.00 ± 2.00)"],
                          ["kerple", "7.50 ± 0.50", "7.00 ± 0.00 (+0.50 ± 0.00)"]]
    # methods with different seed counts say how many each has
    assert [row[0] for row in eval_table(results[:4]).rows] == ["rope (3 seeds)", "kerple (1 seeds)"]


def test_retrieval_grid():
    table = task_table({"task": "passkey", "method": "rope", "train_len": 64, "samples": 8, "chance": 0.001,
                        "depths": [0, 0.5], "lengths": [64, 128], "exact": [[1.0, 0.875], [0.5, 0.0]]})
    assert table.title == "passkey exact of rope (trained at 64; 8 inputs per cell; chance 0.001)"
    assert [c.name for c in table.columns] == ["length", "depth 0", "depth 0.5"]
    assert table.rows == [["64", "1.00", "0.88"], ["128", "0.50", "0.00"]]


def test_sweep_markdown():
    runs = [eval_result("rope", {64: 8.22, 128: 8.35}, {128: -0.18}) | {"corpus": "synthetic"},
            eval_result("kerple", {64: 6.92}, {}) | {"corpus": "synthetic"}]
    assert sweep_markdown(runs) == (
        "# Sweep results\n\n"
        "Perplexity of the last 32 tokens, trained at 64 on `synthetic`; 16 windows.\n\n"
        "| method | 64 | 128 |\n|---|---|---|\n| rope | 8.22 | 8.35 |\n| kerple | 6.92 |  |\n\n"
        "ΔP (positive: context beyond the training length helps):\n\n"
        "| method | 64 | 128 |\n|---|---|---|\n| rope |  | -0.18 |\n| kerple |  |  |\n")


def test_a_rope_extension_at_evaluation_is_its_own_row():
    """`lenx eval RUN --rope-scaling yarn`: the row says rope+yarn, as eval_rope-yarn.json's label does."""
    yarn = eval_result("rope", {64: 8.22, 128: 8.30}, {128: -0.08}) | {"label": "rope+yarn"}
    assert [row[0] for row in eval_table([yarn]).rows] == ["rope+yarn"]
    plain = eval_result("rope", {64: 8.22, 128: 8.35}, {128: -0.18})
    assert [row[0] for row in eval_table([plain, yarn]).rows] == ["rope", "rope+yarn"]


def hf_result(same_as_corpus: bool) -> dict:
    rows = {"64": {"ppl": 9.0, "bpb": 1.5, "input_tokens": [70, 74]},
            "128": {"ppl": 9.5, "bpb": 1.6, "delta_p": -0.5, "input_tokens": [140, 150]}}
    return {"method": "llama", "scored": 32, "window_note": "2 windows", "train_len": 64, "lengths": [64, 128],
            "tokenizer": {"same_as_corpus": same_as_corpus}, "results": rows}


def test_an_hf_model_with_its_own_tokenizer_says_what_the_lengths_count():
    from lenx.report.eval_tables import hf_table

    own = hf_table(hf_result(False))
    assert [c.name for c in own.columns][0] == "corpus tokens"
    assert [row[:2] for row in own.rows] == [["64 (train)", "72"], ["128", "145"]]
    assert own.caption.endswith("; the lengths and the training length 64 (ΔP's, the (train) row's) count corpus "
                                "tokens: at 64 the model reads 72 of its own")
    same = hf_table(hf_result(True))
    assert [c.name for c in same.columns][0] == "length" and "corpus tokens" not in same.caption
