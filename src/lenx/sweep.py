"""Train and evaluate several methods with the same data, seed, budget and evaluation windows."""

import json
from pathlib import Path

from dataclasses import replace

from .checkpoint import checkpoint_dir
from .config import RunConfig, to_toml
from .evaluate import evaluate
from .train import train


def results_table(results: list[dict], key: str = "ppl") -> str:
    """Markdown table: methods x lengths."""
    lengths = sorted({int(L) for r in results for L in r["results"]})
    head = "| method | " + " | ".join(str(L) for L in lengths) + " |"
    rule = "|---|" + "---|" * len(lengths)
    rows = []
    for r in results:
        cells = [f"{r['results'][str(L)][key]:.2f}" if key in r["results"].get(str(L), {}) else "" for L in lengths]
        rows.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    return "\n".join([head, rule] + rows)


def sweep(methods: list[str], cfg: RunConfig, out_dir: Path, progress: bool = True,
          eval_kwargs: dict | None = None) -> dict:
    """Each method gets runs/<out_dir>/<method>; a finished run is not trained again, a partial one
    resumes. Writes results.json, results.md and the figures into out_dir."""
    from .plot import plot_delta_p, plot_perplexity

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for method in methods:
        run_cfg = replace(cfg, model=replace(cfg.model, method=method))
        run_dir = out_dir / method
        ckpt = checkpoint_dir(run_dir)
        if ckpt is None or not (run_dir / "eval.json").exists():
            resume = ckpt is not None
            summary = train(run_cfg, run_dir, resume=resume, progress=progress)
            if not summary["finished"]:
                raise RuntimeError(f"{method}: training stopped early")
            results.append(evaluate(run_dir, progress=progress, **(eval_kwargs or {})))
        else:
            results.append(json.loads((run_dir / "eval.json").read_text()))
    summary = {"methods": methods, "config": to_toml(cfg), "runs": results}
    (out_dir / "results.json").write_text(json.dumps(summary, indent=2))
    md = ["# Sweep results", "", f"Perplexity of the last {results[0]['scored']} tokens, trained at "
          f"{results[0]['train_len']} on `{results[0]['corpus']}`; {results[0]['window_note']}.", "",
          results_table(results, "ppl"), "", "ΔP (positive: context beyond the training length helps):", "",
          results_table(results, "delta_p"), ""]
    (out_dir / "results.md").write_text("\n".join(md))
    figures = [plot_perplexity(results, out_dir / "perplexity.png"), plot_delta_p(results, out_dir / "delta_p.png")]
    return {"results": results, "table": results_table(results), "figures": [str(f) for f in figures],
            "out_dir": str(out_dir)}
