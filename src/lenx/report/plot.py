"""Figures drawn only from files on disk (results.json / eval.json / che.json / attention maps
JSON), so any result can be re-plotted without re-running; nothing here loads a model.

Results may hold the same method several times (one eval result per seed): the perplexity and ΔP
figures draw one line per method (the mean over seeds) with a min-max band. `redraw(path)` re-draws
every figure of a folder tree from its JSON files (`lenx plot FOLDER`).
"""

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
import numpy as np  # noqa: E402

from ..evaluation.files import is_kept  # noqa: E402


class PlotError(ValueError):
    pass


def _label(r: dict) -> str:
    """What a line is called: an explicit "label" (e.g. two variants of one method), else the method."""
    return r.get("label", r["method"])


def aggregate_by_method(results: list[dict], key: str, geometric: bool = False) -> dict[str, dict]:
    """{label: {"lengths", "mean", "min", "max", "n"}} of results[i]["results"][L][key], over the
    results that share a label (seeds). n: how many results (seeds) the label has. Lengths are those
    where any seed has the key; each mean is over the seeds that have it there. geometric=True takes
    the geometric mean (perplexities: the exp of the mean NLL)."""
    by_label: dict[str, list[dict]] = {}
    for r in results:
        by_label.setdefault(_label(r), []).append(r)
    out = {}
    for label, runs in by_label.items():
        lengths = sorted({int(L) for r in runs for L, row in r["results"].items() if key in row})
        series = {"lengths": lengths, "mean": [], "min": [], "max": [], "n": len(runs)}
        for L in lengths:
            values = [r["results"][str(L)][key] for r in runs if key in r["results"].get(str(L), {})]
            if len(values) == 1:
                mean = values[0]  # exactly the value, as the single-seed figure always drew it
            elif geometric:
                mean = math.exp(sum(math.log(v) for v in values) / len(values))
            else:
                mean = sum(values) / len(values)
            series["mean"].append(mean)
            series["min"].append(min(values))
            series["max"].append(max(values))
        out[label] = series
    return out


def _draw_aggregated(ax, results: list[dict], key: str, geometric: bool) -> dict[str, dict]:
    """One line per label; with several seeds a shaded min-max band and "(n seeds)" in the legend.
    A single seed is drawn exactly as before: the plain line, labelled with the method."""
    series = aggregate_by_method(results, key, geometric)
    many = len(series) > 10  # the default cycle has 10 colours: beyond it lines would share one
    for i, (label, s) in enumerate(series.items()):
        if not s["lengths"]:
            continue
        name = label if s["n"] == 1 else f"{label} ({s['n']} seeds)"
        style = dict(color=plt.cm.tab20(i % 20), marker="osD^v<>"[i % 7]) if many else dict(marker="o")
        (line,) = ax.plot(s["lengths"], s["mean"], label=name, **style)
        if s["n"] >= 2:
            ax.fill_between(s["lengths"], s["min"], s["max"], color=line.get_color(), alpha=0.2, lw=0)
    return series


def _legend(ax, results):
    """Inside the axes for a few lines, to the right of them for many."""
    if len({_label(r) for r in results}) > 6:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=8)


def _mark_train_len(ax, results):
    for T in sorted({r["train_len"] for r in results}):
        ax.axvline(T, color="grey", ls="--", lw=1)
        ax.text(T, ax.get_ylim()[1], f" train {T}", va="top", ha="left", fontsize=8, color="grey")


def _length_axis(ax, series: dict[str, dict]):
    """A log2 x axis ticked at the evaluated lengths, written as numbers (128, 256, ...), not 2^7."""
    lengths = sorted({L for s in series.values() for L in s["lengths"]})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(ticker.FixedLocator(lengths))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:.0f}"))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.set_xlabel("evaluation length (tokens)")


def _plain_log_y(ax):
    """A log y axis labelled with plain numbers (the default writes 7×10⁰): within a decade evenly
    chosen values (6.5, 7, 7.5, ...), over one to three decades 1, 2, 5 times its powers of ten (5, 10,
    20, 50: powers of ten alone left a range like 5-60 with one label), and 3 times them too where
    the lowest of those labels would sit above 1.5 x the bottom of the axis (a range of 22-320 was
    labelled from 50, with 4 of 5 curves at 24-47 below it), over three to five 1 and 3 times them
    (powers of ten alone left curves at 24-40 below a lowest label of 100), beyond that the powers
    of ten."""
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    plain = ticker.FuncFormatter(lambda y, _: f"{y:g}")
    if high / low < 10:
        ax.yaxis.set_major_locator(ticker.MaxNLocator(nbins=6))
        ax.yaxis.set_minor_locator(ticker.NullLocator())
        ax.yaxis.set_major_formatter(plain)
    elif high / low < 1e5:
        subs = (1.0, 2.0, 5.0) if high / low < 1000 else (1.0, 3.0)
        if high / low < 1000 and _lowest_label(subs, low) > 1.5 * low:
            subs = (1.0, 2.0, 3.0, 5.0)
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
        ax.yaxis.set_minor_locator(ticker.NullLocator())
        ax.yaxis.set_major_formatter(plain)
    else:
        ax.yaxis.set_major_formatter(ticker.LogFormatter())
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def _lowest_label(subs: tuple[float, ...], low: float) -> float:
    """The smallest s x 10^k (s in subs) at or above `low`."""
    decade = 10.0 ** math.floor(math.log10(low))
    return min(v for v in (s * decade * f for f in (1, 10) for s in subs) if v >= low * (1 - 1e-9))


def _figure(results):
    wide = len({_label(r) for r in results}) > 6  # room for the legend on the right
    return plt.subplots(figsize=(9.5 if wide else 7, 4.5))


def plot_perplexity(results: list[dict], out: Path, title: str | None = None) -> Path:
    fig, ax = _figure(results)
    series = _draw_aggregated(ax, results, "ppl", geometric=True)
    _length_axis(ax, series)
    _plain_log_y(ax)
    ax.set_ylabel(f"perplexity of the last {results[0]['scored']} tokens")
    ax.set_title(title or f"Length extrapolation ({results[0]['corpus']})")
    _mark_train_len(ax, results)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, results)
    return _save(fig, out)


def plot_delta_p(results: list[dict], out: Path, title: str | None = None) -> Path:
    fig, ax = _figure(results)
    series = _draw_aggregated(ax, results, "delta_p", geometric=False)  # ΔP can be negative: arithmetic mean
    ax.axhline(0, color="black", lw=0.8)
    _length_axis(ax, series)
    ax.set_ylabel(f"ΔP (ppl of last {results[0]['delta_p_tokens']} tokens: short − full context)")
    ax.set_title(title or "ΔP > 0: the model gains from context beyond its training length")
    ax.grid(True, alpha=0.3)
    _legend(ax, results)
    return _save(fig, out)


def plot_loss_curves(curves: dict[str, list], out: Path, title: str | None = None, log_y: bool = False,
                     val_curves: dict[str, list] | None = None) -> Path:
    """Training loss against step, one line per label: curves = {label: [[step, loss], ...]}; the
    validation loss (val_curves, same form) dashed in the same colour."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    val_curves = val_curves or {}
    for label, points in curves.items():
        (line,) = ax.plot([p[0] for p in points], [p[1] for p in points], label=label)
        if val_curves.get(label):
            val = val_curves[label]
            ax.plot([p[0] for p in val], [p[1] for p in val], ls="--", marker=".", color=line.get_color(),
                    label=f"{label} (validation)")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("loss" if val_curves else "training loss")
    ax.set_title(title or "Training loss")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)


MAP_TITLES = {"scores": "raw scores QKᵀ/√d", "bias": "position bias", "processed": "after the score processor"}


RETRIEVAL_SCORE = {"passkey": "exact", "copy": "accuracy"}


def plot_retrieval_heatmap(result: dict, out: Path) -> Path:
    """One model's retrieval grid (eval_<task>.json): lengths x depths, each cell annotated."""
    key = RETRIEVAL_SCORE.get(result["task"], "exact")   # suite tasks (lenx.evaluation.suite): exact
    grid = np.array(result[key], dtype=float)
    fig, ax = plt.subplots(figsize=(1.2 * len(result["depths"]) + 2.5, 0.42 * len(result["lengths"]) + 1.6))
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    for (i, j), v in np.ndenumerate(grid):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8, color="white" if v < 0.6 else "black")
    ax.set_xticks(range(len(result["depths"])), [f"{d:g}" for d in result["depths"]])
    ax.set_yticks(range(len(result["lengths"])), [str(L) for L in result["lengths"]])
    ax.set_xlabel("depth of the needle (0: first, 1: last)")
    ax.set_ylabel("context length (tokens)")
    ax.set_title(f"{result['task']} {key}: {_label(result)} (trained at {result['train_len']}; "
                 f"{result['samples']} inputs per cell)", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.05)
    return _save(fig, out)


def plot_retrieval_curves(results: list[dict], out: Path) -> Path:
    """One line per method (label): the score averaged over depths against the context length,
    the mean over seeds with a min-max band."""
    task = results[0]["task"]
    key = RETRIEVAL_SCORE[task]
    flat = [{**r, "results": {str(L): {key: float(np.mean(row))} for L, row in zip(r["lengths"], r[key])}}
            for r in results]
    fig, ax = _figure(flat)
    series = _draw_aggregated(ax, flat, key, geometric=False)
    _length_axis(ax, series)
    ax.axhline(results[0]["chance"], color="grey", lw=0.8, ls=":", label="chance")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(f"{task} {key} (mean over depths)")
    ax.set_title(f"{task}: retrieval beyond the training length")
    _mark_train_len(ax, flat)
    ax.grid(True, alpha=0.3)
    _legend(ax, flat)
    return _save(fig, out)


def load_attention_maps(path: Path) -> dict:
    """The dict lenx.evaluation.attention_maps.save_attention_maps wrote, maps back as float32 arrays with NaN where null."""
    data = json.loads(Path(path).read_text())
    for name in MAP_TITLES:
        if name in data:
            data[name] = np.array([[math.nan if v is None else v for v in row] for row in data[name]],
                                  dtype=np.float32)
    return data


def draw_attention_maps(maps: dict, out: Path, title: str | None = None) -> Path:
    """One panel per map present (scores, bias, processed) of a load_attention_maps() dict (or of
    lenx.evaluation.attention_maps.attention_maps(): any array-like map on the CPU)."""
    panels = {name: maps[name] for name in MAP_TITLES if name in maps}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), squeeze=False)
    for ax, (name, m) in zip(axes[0], panels.items()):
        im = ax.imshow(np.asarray(m), cmap="viridis", interpolation="nearest")
        ax.set_title(MAP_TITLES[name])
        ax.set_xlabel("key position j")
        ax.set_ylabel("query position i")
        fig.colorbar(im, ax=ax, shrink=0.8)
    length = maps.get("length", len(next(iter(panels.values()))))
    fig.suptitle(title or f"{maps.get('method', '?')}: layer {maps.get('layer', '?')}, head {maps.get('head', '?')}, "
                          f"one input of {length} tokens")
    return _save(fig, out)


def _save(fig, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def load_results(path: Path) -> list[dict]:
    """A sweep's results.json (a list of eval results) or a single run's eval.json."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json" if (path / "results.json").exists() else path / "eval.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass a sweep directory, its results.json, or a run's eval.json")
    data = json.loads(path.read_text())
    return data["runs"] if isinstance(data, dict) and "runs" in data else [data] if isinstance(data, dict) else data


# --- re-drawing every figure from JSON ------------------------------------------------------------

def _kind(data) -> str | None:
    """Which figure a JSON file feeds, by its content (None: not a figure's data)."""
    if isinstance(data, dict) and data.get("written_by") == "lenx compare":
        return "compare"
    if not isinstance(data, dict):
        return "results" if isinstance(data, list) and data and all(
            isinstance(r, dict) and "results" in r for r in data) else None
    runs = data.get("runs")
    if isinstance(runs, list) and runs and all(isinstance(r, dict) for r in runs):
        if all("results" in r and "method" in r for r in runs):
            return "results"
        if all("per_length" in r and "task" in r for r in runs) and isinstance(data.get("config"), dict):
            return "che"
    if "method" in data and "scores" in data:
        return "attention"
    if isinstance(data.get("tasks"), dict) and "depths" in data and "lengths" in data:
        return "suite"
    if data.get("task") in RETRIEVAL_SCORE and "depths" in data and "lengths" in data:
        return "retrieval"
    if "results" in data and "method" in data and "train_len" in data:
        return "eval"
    return None


def _read(path: Path):
    """The JSON in `path`, or None when it is unreadable or not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def _figure_name(json_path: Path, folder: Path, figure: str) -> Path:
    """results.json -> perplexity.png as before; another name X.json -> X_perplexity.png (no clashes)."""
    stem = json_path.stem
    return folder / (f"{figure}.png" if stem in ("results", "eval") else f"{stem}_{figure}.png")


def redraw_file(path: Path, folder: Path | None = None) -> list[Path]:
    """Re-draw the figures of one JSON file into folder (default: next to it); [] for unknown JSON."""
    path = Path(path)
    folder = Path(folder) if folder is not None else path.parent
    data = _read(path)
    kind = _kind(data)
    if kind in ("results", "eval"):
        results = load_results(path)
        written = [plot_perplexity(results, _figure_name(path, folder, "perplexity"))]
        if any("delta_p" in row for r in results for row in r["results"].values()):
            written.append(plot_delta_p(results, _figure_name(path, folder, "delta_p")))
        written += _positions_figure(results, _figure_name(path, folder, "per_position"))
        if isinstance(data, dict) and data.get("curves"):
            written.append(plot_loss_curves(data["curves"], _figure_name(path, folder, "loss"),
                                            val_curves=data.get("val_curves")))
        return written
    if kind == "compare":  # `lenx compare`'s JSON: its per-position curves, where it has them
        from .positions import draw_compare

        return [f for f in [draw_compare(data, _figure_name(path, folder, "per_position"))] if f]
    if kind == "attention":
        return [draw_attention_maps(load_attention_maps(path), folder / f"{path.stem}.png")]
    if kind == "retrieval":
        return [plot_retrieval_heatmap(data, _figure_name(path, folder, "heatmap"))]
    if kind == "suite":   # one heatmap per suite task
        from .suite_tables import split_suite

        return [plot_retrieval_heatmap(r, _figure_name(path, folder, f"{r['task']}_heatmap")) for r in split_suite(data)]
    if kind == "che":
        from ..che.protocol import redraw_che

        return redraw_che(path, folder)  # che.md and che_per_length.png
    return []


def redraw(source: Path, out: Path | None = None) -> list[Path]:
    """Re-draw every figure under source from its JSON files, each next to its JSON (or at the same
    relative place under out): results.json -> perplexity.png, delta_p.png (+ loss.png when it has
    "curves"); attention*.json -> attention*.png; che.json -> che.md, che_per_length.png;
    eval_<task>.json (passkey, copy) -> eval_<task>_heatmap.png, and retrieval_<task>.png in the
    folder with one curve per method. A run's eval.json
    is drawn alone only when it is the source itself or the source folder's own; the eval.json files
    of subfolders that no sweep's results.json holds (runs, `lenx eval --hf` results) are drawn
    together, one line each, into the folder's perplexity.png and delta_p.png; the earlier evaluations kept beside it (eval.<key>.json, lenx.evaluation.files) only
    when named as the source. Returns the written files; PlotError when there is nothing to draw."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"{source} not found: pass a folder, a results.json, eval.json, che.json or "
                                "attention JSON file")
    if source.is_file():
        written = redraw_file(source, out)
        if not written:
            raise PlotError(f"{source}: not a results.json, eval.json, che.json or attention maps file")
        return written
    written, retrieval, loose = [], {}, []
    for path in sorted(source.rglob("*.json")):
        if is_kept(path):
            continue
        folder = (Path(out) / path.parent.relative_to(source)) if out is not None else path.parent
        if path.name == "eval.json" or (path.name.startswith("eval_") and _kind(_read(path)) == "eval"):
            # a run's perplexity (eval.json, eval_rope-*.json): drawn only for the folder itself (the
            # old `lenx plot RUN_DIR`) when it has no results.json; a sweep's results.json holds its
            # runs' eval.json; the others (runs or `lenx eval --hf` results in subfolders) are drawn together
            if path.parent != source or (source / "results.json").exists():
                if path.name == "eval.json" and path.parent != source and not _in_sweep(path, source) \
                        and _kind(data := _read(path)) == "eval":
                    loose.append((path.parent.relative_to(source), data))
                continue
        drawn = redraw_file(path, folder)
        if drawn and _kind(data := _read(path)) == "retrieval":
            retrieval.setdefault(data["task"], []).append(data)
        written += drawn
    # every model's retrieval under the folder in one figure per task
    for task, results in sorted(retrieval.items()):
        written.append(plot_retrieval_curves(results, (Path(out) if out is not None else source) / f"retrieval_{task}.png"))
    if loose and not (source / "eval.json").exists() and not (source / "results.json").exists():
        written += _draw_together(loose, Path(out) if out is not None else source)
    if not written:
        raise PlotError(f"nothing to draw under {source}: no results.json, eval.json, che.json or attention*.json "
                        "with figure data")
    return written


def _in_sweep(path: Path, source: Path) -> bool:
    """Whether a folder between `source` and the eval.json `path` holds a sweep's results.json."""
    return any((folder / "results.json").exists() for folder in path.parents
               if folder == source or source in folder.parents)


def _draw_together(evals: list[tuple[Path, dict]], folder: Path) -> list[Path]:
    """One perplexity figure (and ΔP's) of every eval.json found in subfolders, one line each: a
    name that two of them share is followed by the folder (they are not seeds of one method, as a
    sweep's are: `lenx sweep` and `lenx compare` pool seeds)."""
    names = [_label(r) for _, r in evals]
    results = [r | {"label": f"{name} ({where})"} if names.count(name) > 1 else r
               for name, (where, r) in zip(names, evals)]
    written = [plot_perplexity(results, folder / "perplexity.png")]
    if any("delta_p" in row for r in results for row in r["results"].values()):
        written.append(plot_delta_p(results, folder / "delta_p.png"))
    return written + _positions_figure(results, folder / "per_position.png")


def _positions_figure(results: list[dict], out: Path) -> list[Path]:
    """The per-position loss of the results that have it (lenx.report.positions), one curve each."""
    from .positions import plot_curves, result_curves

    curves = result_curves(results, error=PlotError)
    return [plot_curves(curves, out)] if curves else []
