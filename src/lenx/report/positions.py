"""Per-position loss curves from eval.json's "per_position" (lenx.evaluation.positions writes it):
each method's mean NLL per position bin with an interval over documents and training seeds, for
`lenx compare` (compare.json's "per_position") and the figure of `lenx compare` and `lenx plot`
(the FoX paper's per-position loss, the training length marked).

A bin's value per window is the window's mean NLL over the bin's positions; a method's seeds are
pooled window by window and each bin gets stats.method_interval on the NLL scale (documents
resampled, seeds by Student's t), as the perplexity of a length does. An eval.json without
"per_position" (an older lenx eval, or one without --per-position) has no curve, and says so.
"""

import math
from pathlib import Path

import numpy as np

from .stats import method_interval

NO_CURVE = "no eval.json of this method has per_position (evaluate with `lenx eval RUN --per-position`)"


class PositionsError(ValueError):
    """A per_position entry that cannot be read; the message is one line."""


def run_positions(entry, windows: int, where: str, error=PositionsError) -> dict | None:
    """An eval.json's per_position entry as {"edges", "unit", "rows": [bins, windows] float64}, or
    None when there is none; `error` (one line) when it is malformed."""
    if entry is None:
        return None
    try:
        edges = [int(e) for e in entry["edges"]]
        rows = np.asarray(entry["window_nll"], dtype=np.float64)
    except (KeyError, TypeError, ValueError):
        raise error(f"{where} has an unreadable per_position entry; evaluate it again with "
                    "`lenx eval RUN --per-position`") from None
    if len(edges) < 2 or rows.shape != (len(edges) - 1, windows) or not np.isfinite(rows).all():
        raise error(f"{where}'s per_position does not match its {windows} windows (or holds NaN); evaluate it "
                    "again with `lenx eval RUN --per-position`")
    return {"edges": edges, "unit": entry.get("unit", "corpus tokens"), "rows": rows}


def curve(seeds: list[dict], documents, n: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """One method's curve from its seeds' run_positions (the same edges): per bin the seed-mean NLL
    with its interval over documents and seeds."""
    rows = np.stack([s["rows"] for s in seeds])  # [seeds, bins, windows]
    bins = [method_interval(rows[:, b], documents, n=n, seed=seed, level=level, scale="nll")
            for b in range(rows.shape[1])]
    return {"edges": seeds[0]["edges"], "unit": seeds[0]["unit"], "seeds": len(seeds),
            "nll": [b["value"] for b in bins], "lo": [b["lo"] for b in bins], "hi": [b["hi"] for b in bins],
            "covers": bins[0]["covers"]}


def method_curves(groups: dict[str, list[dict]], windows: int, documents, boot: dict,
                  error=PositionsError) -> dict[str, dict]:
    """{method: curve, or {"note": why none}} of compare's grouped runs (each with eval.json's raw
    "per_position"); {} when no run has one. `error`: the exception for a malformed entry."""
    if not any(r.get("per_position") is not None for members in groups.values() for r in members):
        return {}
    out = {}
    for method, members in groups.items():
        found = [run_positions(r.get("per_position"), windows, f"{r['run']}/eval.json", error) for r in members]
        if all(f is None for f in found):
            out[method] = {"note": NO_CURVE}
        elif any(f is None or f["edges"] != found[0]["edges"] for f in found):
            out[method] = {"note": "its seeds' eval.json do not all have per_position with the same bins; evaluate "
                                   "every seed with `lenx eval RUN --per-position`"}
        else:
            out[method] = curve(found, documents, **boot) | {"train_len": members[0]["train_len"]}
    return out


def result_curves(results: list[dict], boot: dict | None = None, error=PositionsError) -> dict[str, dict]:
    """Curves of eval results (eval.json, a sweep's results.json) that have per_position, by label
    (a method's seeds pooled); results without it are left out; `error` for a malformed one."""
    by_label: dict[str, list[dict]] = {}
    for r in results:
        if isinstance(r.get("per_position"), dict) and isinstance(r.get("window_documents"), list):
            by_label.setdefault(r.get("label", r["method"]), []).append(r)
    out = {}
    for label, runs in by_label.items():
        documents = runs[0]["window_documents"]
        found = [run_positions(r["per_position"], len(documents), r.get("run", label), error) for r in runs]
        if any(f["edges"] != found[0]["edges"] for f in found):
            raise error(f"the {label} results have per_position with other bins")
        out[label] = curve(found, documents, **(boot or {})) | {"train_len": runs[0].get("train_len")}
    return out


def plot_curves(curves: dict[str, dict], out: Path, title: str | None = None) -> Path:
    """The mean NLL per position bin of every curve on one figure, each with its interval as a band,
    against the tokens read (position + 1, log axis), the training lengths marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    drawn = {label: c for label, c in curves.items() if "nll" in c}
    fig, ax = plt.subplots(figsize=(9.5 if len(drawn) > 6 else 7, 4.5))
    for label, c in drawn.items():
        edges = c["edges"]
        # a bin holds tokens read edges[k] + 1 .. edges[k + 1]: drawn at their geometric middle
        x = [math.sqrt((lo + 1) * hi) for lo, hi in zip(edges[:-1], edges[1:])]
        name = label if c.get("seeds", 1) == 1 else f"{label} ({c['seeds']} seeds)"
        if c.get("covers") != "seeds and documents":  # say what the band leaves out
            name += f" (band: {c.get('covers')})"
        (line,) = ax.plot(x, c["nll"], label=name, lw=1.4, marker=".")
        ax.fill_between(x, c["lo"], c["hi"], color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.0f}"))  # 256, not 2^8
    for T in sorted({c["train_len"] for c in drawn.values() if isinstance(c.get("train_len"), int)}):
        ax.axvline(T, color="grey", ls="--", lw=1)
        ax.text(T, ax.get_ylim()[1], f" train {T}", va="top", ha="left", fontsize=8, color="grey")
    units = {c["unit"] for c in drawn.values()}
    ax.set_xlabel(f"tokens read (position + 1, {' / '.join(sorted(units))})")
    ax.set_ylabel("mean NLL (nats per token)")
    ax.set_title(title or "Loss by position (bands: 95% intervals over documents and seeds)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    from .plot import _save

    return _save(fig, out)


def draw_compare(result: dict, out: Path) -> Path | None:
    """The figure of a compare result's per_position curves (None when no method has one)."""
    curves = result.get("per_position") or {}
    if not any("nll" in c for c in curves.values()):
        return None
    return plot_curves(curves, out)
