"""Figures from JSON: seeds aggregated per method, loss curves, attention maps as JSON (computed by
evaluation, drawn by plot), and `lenx plot FOLDER` re-drawing a whole tree."""

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from lenx.evaluation.attention_maps import attention_maps, check_json_size, map_names, save_attention_maps
from lenx.report import plot
from lenx.report.plot import aggregate_by_method


def eval_result(method, ppl: dict, delta_p: dict | None = None, seed=None, train_len=32):
    """A minimal eval.json: {L: ppl} (and ΔP) per length."""
    results = {str(L): {"ppl": p, "ppl_full": p, "nll": math.log(p)} for L, p in ppl.items()}
    for L, d in (delta_p or {}).items():
        results[str(L)]["delta_p"] = d
    r = {"method": method, "train_len": train_len, "corpus": "synthetic", "scored": 16, "delta_p_tokens": 16,
         "window_note": "test", "results": results}
    if seed is not None:
        r["seed"] = seed
    return r


def seeded_results():
    return [eval_result("rope", {32: 2.0, 64: 8.0}, {64: -1.0}, seed=0),
            eval_result("rope", {32: 8.0, 64: 2.0}, {64: 3.0}, seed=1),
            eval_result("kerple", {32: 3.0, 64: 4.0, 128: 5.0}, {64: 0.5, 128: 0.25})]


def test_aggregate_by_method_means_over_seeds():
    res = seeded_results()
    ppl = aggregate_by_method(res, "ppl", geometric=True)
    assert list(ppl) == ["rope", "kerple"]
    rope = ppl["rope"]
    assert rope["n"] == 2 and rope["lengths"] == [32, 64]
    assert rope["mean"] == pytest.approx([4.0, 4.0])  # geometric: sqrt(2 * 8)
    assert rope["min"] == [2.0, 2.0] and rope["max"] == [8.0, 8.0]
    assert ppl["kerple"] == {"lengths": [32, 64, 128], "mean": [3.0, 4.0, 5.0], "min": [3.0, 4.0, 5.0],
                             "max": [3.0, 4.0, 5.0], "n": 1}
    dp = aggregate_by_method(res, "delta_p")
    assert dp["rope"]["lengths"] == [64] and dp["rope"]["mean"] == pytest.approx([1.0])  # arithmetic
    # a length only one seed reached is the mean of that seed alone; a label keeps variants apart
    res[1]["results"]["128"] = {"ppl": 6.0}
    res.append(dict(eval_result("rope", {32: 100.0}), label="rope (leak)"))
    ppl = aggregate_by_method(res, "ppl", geometric=True)
    assert ppl["rope"]["lengths"] == [32, 64, 128] and ppl["rope"]["mean"][2] == pytest.approx(6.0)
    assert ppl["rope (leak)"]["n"] == 1 and ppl["rope"]["n"] == 2


def legends(monkeypatch):
    """Collect the legend texts of every figure saved."""
    seen = []
    real = plot._save

    def spy(fig, out):
        seen.append([t.get_text() for t in fig.axes[0].get_legend().get_texts()])
        return real(fig, out)

    monkeypatch.setattr(plot, "_save", spy)
    return seen


def test_multi_seed_figures(tmp_path, monkeypatch):
    seen = legends(monkeypatch)
    res = seeded_results()
    assert plot.plot_perplexity(res, tmp_path / "ppl.png").stat().st_size > 10_000
    assert plot.plot_delta_p(res, tmp_path / "dp.png").stat().st_size > 10_000
    assert seen == [["rope (2 seeds)", "kerple"], ["rope (2 seeds)", "kerple"]]
    # one seed per method: labelled with the method alone, as before
    seen.clear()
    plot.plot_perplexity(res[1:], tmp_path / "one.png")
    assert seen == [["rope", "kerple"]]


def saved_figures(monkeypatch):
    """Every figure saved, drawn so that its tick labels are set."""
    figures = []
    real = plot._save

    def spy(fig, out):
        fig.canvas.draw()
        figures.append(fig)
        return real(fig, out)

    monkeypatch.setattr(plot, "_save", spy)
    return figures


def test_axes_read_as_plain_numbers(tmp_path, monkeypatch):
    """The x axis is labelled with the evaluated lengths, the log y axis with plain numbers (not 2^7
    or 7x10^0), for a narrow range and for one over several decades."""
    figures = saved_figures(monkeypatch)
    narrow = [eval_result("rope", {64: 8.22, 128: 8.35, 256: 8.47, 512: 8.57}, {128: -0.18, 512: -0.41}),
              eval_result("kerple", {64: 6.92, 128: 6.93, 256: 6.95, 512: 6.96})]
    wide = [eval_result("rope", {128: 12.0, 1024: 200.0, 8192: 9000.0})]
    decade = [eval_result("rope", {128: 5.0, 1024: 18.0, 8192: 60.0})]   # 12x: one power of ten inside
    plot.plot_perplexity(narrow, tmp_path / "a.png")
    plot.plot_delta_p(narrow, tmp_path / "b.png")
    plot.plot_perplexity(wide, tmp_path / "c.png")
    plot.plot_perplexity(decade, tmp_path / "d.png")

    def labels(axis):
        """The tick labels shown: those with text, inside the axis' view."""
        low, high = sorted(axis.get_view_interval())
        at = 0 if axis.axis_name == "x" else 1
        return [t.get_text() for t in axis.get_ticklabels(which="both")
                if t.get_text() and low <= t.get_position()[at] <= high]

    axes = [fig.axes[0] for fig in figures]
    assert [labels(ax.xaxis) for ax in axes] == [["64", "128", "256", "512"], ["128", "512"],
                                                 ["128", "1024", "8192"], ["128", "1024", "8192"]]
    for ax in (axes[0], axes[2], axes[3]):
        ys = labels(ax.yaxis)
        assert len(ys) >= 2 and all(re.fullmatch(r"[0-9.]+", y) for y in ys), ys
    assert set(labels(axes[2].yaxis)) >= {"100", "1000"}
    assert set(labels(axes[3].yaxis)) >= {"10", "20", "50"}  # 1-2-5 steps, not "10" alone


def test_curves_far_below_the_highest_are_labelled(tmp_path, monkeypatch):
    """Four methods at 24-45 and one that climbs to 30,000: the lowest label sits at the low curves,
    not a decade above them (powers of ten alone left 4 of 5 curves below the lowest label)."""
    figures = saved_figures(monkeypatch)
    low = [eval_result(m, {128: 24.0 + i, 1024: 30.0 + i, 8192: 40.0 + i}) for i, m in
           enumerate(["kerple", "alibi", "fire", "dapev2-kerple"])]
    plot.plot_perplexity(low + [eval_result("rope", {128: 30.0, 1024: 900.0, 8192: 30000.0})], tmp_path / "a.png")
    ax = figures[0].axes[0]
    bottom, top = ax.get_ylim()
    shown = [t.get_position()[1] for t in ax.yaxis.get_ticklabels() if t.get_text() and bottom <= t.get_position()[1] <= top]
    assert min(shown) <= 1.5 * 24 and max(shown) >= 10000, shown


def test_curves_just_above_a_power_of_ten_are_labelled(tmp_path, monkeypatch):
    """results/repro's headline figure: four methods at 24-47 and rope up to 320, about one decade.
    1, 2, 5 times the powers of ten labelled it from 50 (20 falls below the axis); 30 now labels the
    low curves."""
    figures = saved_figures(monkeypatch)
    low = [eval_result(m, {256: 24.0 + 8 * i, 2048: 25.0 + 8 * i, 16384: 24.3 + 8 * i}) for i, m in
           enumerate(["kerple", "dape-kerple", "dapev2-kerple", "stickbreaking"])]
    plot.plot_perplexity(low + [eval_result("rope", {256: 53.0, 2048: 219.0, 16384: 314.0})], tmp_path / "a.png")
    ax = figures[0].axes[0]
    bottom, top = ax.get_ylim()
    shown = [t.get_text() for t in ax.yaxis.get_ticklabels() if t.get_text() and bottom <= t.get_position()[1] <= top]
    assert shown == ["30", "50", "100", "200", "300"], shown


def test_loss_curves(tmp_path, monkeypatch):
    seen = legends(monkeypatch)
    curves = {"dapev2-kerple": [[1, 5.0], [2, 4.0], [3, 3.5]], "dapev2-kerple (leak)": [[1, 5.0], [2, 2.0], [3, 0.1]]}
    out = plot.plot_loss_curves(curves, tmp_path / "loss.png", title="information leakage", log_y=True)
    assert out.stat().st_size > 10_000 and seen == [list(curves)]


def synthetic_maps(T=5):
    scores = torch.randn(T, T)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    return {"scores": scores.masked_fill(mask, math.nan), "bias": (-torch.rand(T, T)).masked_fill(mask, math.nan),
            "method": "kerple", "layer": 1, "head": 0, "length": T}


def check_round_trip(maps, path):
    save_attention_maps(maps, path)
    raw = json.loads(path.read_text())  # strict JSON: NaN is written as null
    assert raw["scores"][0][1] is None and raw["scores"][1][0] is not None
    back = plot.load_attention_maps(path)
    for name in ("scores", "bias", "processed"):
        assert (name in back) == (name in maps)
        if name in maps:
            assert back[name].dtype == np.float32
            np.testing.assert_array_equal(back[name], maps[name].float().numpy())  # float32 exact, NaN where NaN
    assert {k: back[k] for k in ("method", "layer", "head", "length")} == \
        {k: maps[k] for k in ("method", "layer", "head", "length")}
    return back


def test_attention_maps_json_round_trip(tmp_path):
    back = check_round_trip(synthetic_maps(), tmp_path / "attention_L1_H0.json")
    assert plot.draw_attention_maps(back, tmp_path / "attention_L1_H0.png").stat().st_size > 5_000


def test_attention_maps_of_a_tiny_run(tmp_path):
    from lenx.config import load_config
    from lenx.training.loop import train

    cfg = load_config("tiny", ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=16",
                               "train.batch_size=2", "train.steps=1", "model.method=dapev2-kerple",
                               f"data.root={str(tmp_path / 'data')!r}"])
    train(cfg, tmp_path / "run", progress=False)
    maps = attention_maps(tmp_path / "run", torch.arange(12) % 7, layer=0, head=1)
    assert set(maps) == {"scores", "bias", "processed", "method", "layer", "head", "length"}
    assert maps["length"] == 12 and maps["method"] == "dapev2-kerple"
    check_round_trip(maps, tmp_path / "run" / "attention_L0_H1.json")
    # without tokens: the first `length` tokens of the run's test split
    first = attention_maps(tmp_path / "run", layer=0, head=1, length=9)
    assert first["length"] == 9 and first["scores"].shape == (9, 9)
    assert map_names("dapev2-kerple") == ["scores", "bias", "processed"]


@pytest.mark.parametrize("method, names", [("rope", ["scores"]), ("kerple", ["scores", "bias"]),
                                           ("cope", ["scores", "processed"]),
                                           ("dape-stickbreaking-t5", ["scores", "bias", "processed"])])
def test_the_maps_each_method_draws(method, names):
    from lenx.attention import Attention
    from lenx.attention.backends import score_block
    from lenx.config import AttentionConfig

    attn = Attention(AttentionConfig(method=method), 2, 16)
    q = k = torch.randn(1, 2, 6, 8)
    _, bias, _ = score_block(q, k, attn.parts)
    assert map_names(method) == ["scores"] + (["bias"] if bias is not None else []) + \
        (["processed"] if attn.processor is not None else [])
    assert map_names(method) == names


def test_the_size_of_the_maps_json_is_bounded(tmp_path, monkeypatch):
    """--attention's JSON grows as T^2: above the bound it needs --force, and the error names the size."""
    from lenx.config import ConfigError
    from lenx.evaluation import attention_maps as maps

    with pytest.raises(ConfigError) as e:
        check_json_size("dapev2-kerple", 100000)
    assert str(e.value).startswith("--length 100000 would write about 330.0 GB of JSON (3 maps of 100000 x 100000")
    assert "up to --length 1740" in str(e.value) and "--force" in str(e.value)
    check_json_size("dapev2-kerple", 1740)
    check_json_size("rope", 3015)
    check_json_size("dapev2-kerple", 100000, force=True)
    # the estimate is honest: 64 tokens, the bound lowered below what they write
    monkeypatch.setattr(maps, "MAX_JSON_BYTES", 10_000)
    save_attention_maps(synthetic_maps(64), tmp_path / "a.json")
    written = (tmp_path / "a.json").stat().st_size
    assert 0.7 < 2 * 64 ** 2 * maps.JSON_BYTES_PER_ENTRY / written < 1.5
    with pytest.raises(ConfigError, match="about 90 KB"):
        check_json_size("kerple", 64)


def make_tree(root):
    """A results tree: a seeded sweep with loss curves, a CHE run, saved attention maps, and JSON
    that draws nothing (a run's eval.json inside the sweep, an unrelated file)."""
    from lenx.che.protocol import make_config, run_che

    sweep = root / "sweep"
    sweep.mkdir(parents=True)
    summary = {"methods": ["rope", "kerple"], "config": "", "runs": seeded_results(),
               "curves": {"rope": [[1, 4.0], [2, 3.0]], "kerple": [[1, 4.5], [2, 2.5]]}}
    (sweep / "results.json").write_text(json.dumps(summary))
    (sweep / "rope").mkdir()
    (sweep / "rope" / "eval.json").write_text(json.dumps(seeded_results()[0]))
    (sweep / "rope" / "meta.json").write_text(json.dumps({"params": 1}))
    (root / "broken.json").write_text("{not json")
    cfg = make_config("smoke", tasks=["parity_check"], methods=["rope"], steps=1, test_max_length=41,
                      test_samples=4, n_layer=1)
    run_che(cfg, root / "che", progress=False)
    (root / "che" / "che_per_length.png").unlink()
    save_attention_maps(synthetic_maps(), root / "maps" / "attention_L1_H0.json")


EXPECTED = {"sweep/perplexity.png", "sweep/delta_p.png", "sweep/loss.png", "che/che.md", "che/che_per_length.png",
            "maps/attention_L1_H0.png"}


def test_redraw_a_folder_tree(tmp_path):
    make_tree(tmp_path / "tree")
    written = plot.redraw(tmp_path / "tree")
    assert {p.relative_to(tmp_path / "tree").as_posix() for p in written} == EXPECTED
    assert all(p.stat().st_size > 10_000 for p in written if p.suffix == ".png")
    assert not (tmp_path / "tree" / "sweep" / "rope" / "perplexity.png").exists()  # inside the sweep's results
    # --out: the same layout elsewhere
    written = plot.redraw(tmp_path / "tree", tmp_path / "figs")
    assert {p.relative_to(tmp_path / "figs").as_posix() for p in written} == EXPECTED
    # a run folder alone draws its eval.json as before
    assert [p.name for p in plot.redraw(tmp_path / "tree" / "sweep" / "rope")] == ["perplexity.png", "delta_p.png"]
    with pytest.raises(plot.PlotError, match="not a results.json"):
        plot.redraw(tmp_path / "tree" / "sweep" / "rope" / "meta.json")


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600)


def test_cli_plot_folder(tmp_path):
    make_tree(tmp_path / "tree")
    out = run_cli("plot", str(tmp_path / "tree"))
    assert out.returncode == 0, out.stderr
    printed = {line.strip() for line in out.stdout.splitlines() if line.strip()}
    assert printed == {str(tmp_path / "tree" / p) for p in EXPECTED}
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "other.json").write_text("[1, 2]")
    out = run_cli("plot", str(tmp_path / "empty"))
    assert out.returncode == 2 and "nothing to draw" in out.stderr and "Traceback" not in out.stderr


def test_retrieval_heatmaps_and_curves_from_json(tmp_path):
    """eval_<task>.json files -> a heatmap next to each, one curve figure per task for the folder."""
    from lenx.report.plot import redraw

    for method, seed, acc in (("rope", 0, 0.2), ("rope", 1, 0.4), ("dapev2-kerple", 0, 0.9)):
        run = tmp_path / f"{method}-s{seed}"
        run.mkdir()
        (run / "eval_copy.json").write_text(json.dumps({
            "run": str(run), "method": method, "train_len": 128, "corpus": "tech", "task": "copy",
            "lengths": [128, 256, 512], "depths": [0.0, 0.5, 1.0], "samples": 4, "seed": 1, "split": "test",
            "accuracy": [[acc] * 3, [acc / 2] * 3, [acc / 4] * 3], "chance": 1 / 16384}))
    written = {p.name for p in redraw(tmp_path)}
    assert written == {"eval_copy_heatmap.png", "retrieval_copy.png"}
    assert (tmp_path / "retrieval_copy.png").stat().st_size > 0
    assert all((tmp_path / d / "eval_copy_heatmap.png").is_file() for d in ("rope-s0", "rope-s1", "dapev2-kerple-s0"))


def test_a_folder_of_evaluations_in_subfolders_is_drawn_together(tmp_path, monkeypatch):
    """`lenx plot runs/hf` (lenx eval --hf results, one per subfolder): one figure, one line per
    result; a name two of them share is followed by its folder (not pooled as seeds)."""
    seen = legends(monkeypatch)
    for folder, result in (("exp-rope", eval_result("rope", {32: 2.0, 64: 3.0}) | {"kind": "hf"}),
                           ("llama", eval_result("llama", {32: 4.0, 64: 5.0}) | {"kind": "hf"}),
                           ("deeper/rope", eval_result("rope", {32: 2.5, 64: 3.5}))):
        (tmp_path / "hf" / folder).mkdir(parents=True)
        (tmp_path / "hf" / folder / "eval.json").write_text(json.dumps(result))
    written = plot.redraw(tmp_path / "hf")
    assert written == [tmp_path / "hf" / "perplexity.png"]
    assert seen == [["rope (deeper/rope)", "rope (exp-rope)", "llama"]]
