"""Turn what came back from the device (runs/repro, unpacked) into results/repro: per experiment a
results.json (every run's eval.json with its seed, label, command and loss curve), the runs' small
files, the merged CHE results, the timing table, the attention maps; then re-draw every figure
(`lenx plot results/repro`) and write tables.md, which REPORT.md quotes.

    python scripts/repro/collect.py SOURCE [SOURCE ...] [--out results/repro]

A SOURCE is a device tree (runs/repro as it came back) or an earlier results/repro: a later session
that finishes the missing jobs is collected with `collect.py results/repro NEW_TREE --out NEW`.
"""

import argparse
import json
import math
from pathlib import Path
import re
import shutil
import statistics
import tomllib

from lenx.report.tables import Table, columns, to_markdown

KEEP = ("config.toml", "meta.json", "metrics.jsonl", "eval.json", "command.txt", "job.log")
DEVICE_FILES = ("plan.json", "status.json", "scheduler.log", "machine.txt")  # a device tree's scheduler files


def finished(run: Path) -> bool:
    """Trained every step and evaluated (its eval.json says so)."""
    try:
        e = json.loads((run / "eval.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(e.get("finished")) and e.get("step") == e.get("steps")
LM_EXPERIMENTS = ("tech-T128", "tech-T512", "books-T128", "kernel-size", "leak",
                  "capacity", "sb-remainder", "T2048", "tech-T512-b64")  # the last four: plan.py controls
# The paper's figures as subsets of the tech-T128 runs (figure 2 is the whole experiment).
FIGURES = {
    "fig1-nope-rope": ["nope", "dapev2-nope", "rope", "dapev2-rope"],
    "fig5-bias-bases": ["alibi", "dapev2-alibi", "kerple", "dape-kerple", "dapev2-kerple", "fire", "dapev2-fire"],
    "headline": ["rope", "kerple", "dape-kerple", "dapev2-kerple", "stickbreaking"],
}


def label(cfg: dict) -> str:
    m = cfg["model"]
    name = m["method"]
    if m.get("dape_leak"):
        name += " (leak)"
    if "dapev2" in name and m.get("dape_kernel", 3) != 3:
        name += f" (k={m['dape_kernel']})"
    if "dape" in name and m.get("dape_hidden", 32) != 32:
        name += f" (D={m['dape_hidden']})"
    if m.get("sb_remainder", "value") != "value":
        name += f" (remainder={m['sb_remainder']})"
    if m.get("sb_attend_current"):
        name += " (attend current)"
    return name


def load_run(run: Path) -> dict | None:
    if not (run / "eval.json").exists() and not (run / "metrics.jsonl").exists():
        return None
    cfg = tomllib.loads((run / "config.toml").read_text())
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if not metrics or metrics[-1]["step"] < cfg["train"]["steps"]:
        return None  # cut off when the machine went back: a later session runs it again
    out = json.loads((run / "eval.json").read_text()) if (run / "eval.json").exists() else {"results": {}}
    out.update(name=run.name, label=label(cfg), seed=cfg["train"]["seed"], command=(run / "command.txt").read_text().strip(),
               final_train_loss=metrics[-1]["loss"] if metrics else None,
               tokens_per_s=statistics.median(r["tokens_per_s"] for r in metrics[1:]) if len(metrics) > 1 else None,
               curve=[[r["step"], r["loss"]] for r in metrics])
    return out


def run_dirs(sources: list[Path], experiment: str) -> dict[str, Path]:
    """name -> run folder over all sources: a raw device tree holds src/<exp>/<run>, a results tree
    src/<exp>/runs/<run>; a later source replaces an earlier one's run of the same name."""
    found = {}
    for src in sources:
        for pattern in ("*", "runs/*"):
            for run in sorted((src / experiment).glob(pattern)):
                if (run / "config.toml").exists():
                    found[run.name] = run
    return found


def collect_lm(runs_in: dict[str, Path], out: Path, experiment: str, extra: list[Path] = ()) -> list[dict]:
    runs = []
    for run in {**runs_in, **{r.name: r for r in extra}}.values():
        r = load_run(run)
        if r is None:
            continue
        dest = out / experiment / "runs" / run.name
        dest.mkdir(parents=True, exist_ok=True)
        for name in KEEP:
            if (run / name).exists():
                shutil.copy(run / name, dest / name)
        runs.append(r)
    if runs:
        curves = {f"{r['label']} s{r['seed']}": r.pop("curve") for r in runs}
        evaluated = [r for r in runs if r["results"]]
        meta = json.loads((out / experiment / "runs" / runs[0]["name"] / "meta.json").read_text())
        (out / experiment / "results.json").write_text(json.dumps(
            {"experiment": experiment, "environment": meta["environment"], "runs": evaluated, "curves": curves},
            indent=1))
    return runs


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def ppl_table(runs: list[dict], key: str = "ppl", order: list[str] | None = None) -> str:
    lengths = sorted({int(L) for r in runs for L in r["results"] if key in r["results"][L]})
    labels = order or list(dict.fromkeys(r["label"] for r in runs))
    table = Table(None, columns("method", "seeds", *map(str, lengths)))
    for lab in labels:
        group = [r for r in runs if r["label"] == lab and r["results"]]
        if not group:
            continue
        cells = []
        for L in lengths:
            vals = [r["results"][str(L)][key] for r in group if key in r["results"].get(str(L), {})]
            cells.append(mean_std(vals) if vals and all(math.isfinite(v) for v in vals) else "")
        table.add_row(lab, str(len(group)), *cells)
    return to_markdown(table)


DEVICE_FILES = ("plan.json", "status.json", "machine.txt", "scheduler.log")


def copy_device_files(sources: list[Path], out: Path):
    """Each device session's plan, status, machine and scheduler log. A results tree (an earlier
    collection) brings its own; a later device tree's files get a suffix: status-2.json, ..."""
    pattern = re.compile(r"(plan|status|machine|scheduler)(?:-(\d+))?\.(json|txt|log)")
    sessions = 0
    for src in sources:
        if (src / "tables.md").exists():
            for f in sorted(src.iterdir()):
                m = pattern.fullmatch(f.name)
                if m:
                    shutil.copy(f, out / f.name)
                    sessions = max(sessions, int(m.group(2) or 1))
            continue
        sessions += 1
        for name in DEVICE_FILES:
            if (src / name).exists():
                stem, ext = name.rsplit(".", 1)
                shutil.copy(src / name, out / (name if sessions == 1 else f"{stem}-{sessions}.{ext}"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("sources", type=Path, nargs="+",
                   help="device trees (runs/repro as it came back) and/or an earlier results/repro; later ones win")
    p.add_argument("--out", type=Path, default=Path("results/repro"))
    args = p.parse_args()
    sources, out = args.sources, args.out
    if any(out.resolve() == s.resolve() for s in sources):
        raise SystemExit("--out must be a new folder, not one of the sources (then move it into place)")
    out.mkdir(parents=True, exist_ok=True)
    tables = ["# Tables generated by scripts/repro/collect.py from the committed JSON", ""]
    k3 = [run for name, run in run_dirs(sources, "tech-T128").items() if name == "dapev2-kerple-s0"]
    for exp in LM_EXPERIMENTS:
        extra = k3 if exp in ("kernel-size", "leak") else []  # k = 3, no leak: run 1's seed-0 model
        runs = collect_lm(run_dirs(sources, exp), out, exp, extra)
        if not runs:
            continue
        if exp == "tech-T128":
            for fig, labels in FIGURES.items():
                chosen = [r for r in runs if r["label"] in labels and r["results"]]
                if not chosen:  # a collection without the figure's runs (the controls)
                    continue
                chosen.sort(key=lambda r: labels.index(r["label"]))
                (out / "figures" / fig).mkdir(parents=True, exist_ok=True)
                (out / "figures" / fig / "results.json").write_text(json.dumps(
                    {"experiment": f"tech-T128 ({fig})", "runs": chosen}, indent=1))
        training = Table(None, columns("run", "seed", "final loss", "tokens/s"))
        for r in runs:
            training.add_row(r["label"], str(r["seed"]), f"{r['final_train_loss']:.4f}", f"{r['tokens_per_s'] or 0:,.0f}")
        tables += [f"## {exp}: perplexity of the last 256 tokens (mean ± std over seeds)", "", ppl_table(runs),
                   f"## {exp}: ΔP", "", ppl_table(runs, "delta_p"),
                   f"## {exp}: final training loss, training tokens/s (median over logging intervals)", "",
                   to_markdown(training)]

    che_all = {}  # name -> its folders with runs.jsonl, in source order (a resumed run has several)
    for src in sources:
        for pattern in ("che/*", "che/runs/*"):
            for d in sorted(src.glob(pattern)):
                if (d / "runs.jsonl").exists():
                    che_all.setdefault(d.name, []).append(d)
    che_dirs = {name: dirs[-1] for name, dirs in che_all.items()}  # the latest runs.jsonl holds every task
    if che_dirs:
        from lenx.che.protocol import merge_che

        merge_che(list(che_dirs.values()), out / "che")
        merged = json.loads((out / "che" / "che.json").read_text())
        merged["merged_from"] = [f"runs/{name}" for name in che_dirs]  # their copies below, not device paths
        (out / "che" / "che.json").write_text(json.dumps(merged, indent=2))
        for name, dirs in che_all.items():
            dest = out / "che" / "runs" / name
            dest.mkdir(parents=True, exist_ok=True)
            for f in ("command.txt", "runs.jsonl"):
                found = [d / f for d in dirs if (d / f).exists()]
                if found:
                    shutil.copy(found[-1], dest / f)
            # a run resumed in a later session: its logs one after the other
            logs = []
            for d in dirs:
                text = (d / "job.log").read_text(errors="replace") if (d / "job.log").exists() else None
                if text and text not in logs:
                    logs.append(text)
            if logs:
                (dest / "job.log").write_text("\n--- resumed in a later session ---\n".join(logs))
        tables += ["## CHE", "", (out / "che" / "che.md").read_text(), ""]

    timing = [src / "timing" for src in sources if (src / "timing" / "train_step.json").exists()]
    if timing:
        (out / "timing").mkdir(parents=True, exist_ok=True)
        for name in ("train_step.json", "command.txt", "job.log"):
            if (timing[-1] / name).exists():
                shutil.copy(timing[-1] / name, out / "timing" / name)
        from lenx.report.bench_tables import train_step_table

        tables += ["## Time per training step (125m, length 512)", "",
                   to_markdown(train_step_table(json.loads((timing[-1] / "train_step.json").read_text()))), ""]

    for src in sources:
        maps = [(m, f"{m.parent.name}_{m.name}") for m in src.glob("tech-T128/*/attention_*.json")]
        maps += [(m, m.name) for m in src.glob("attention/*.json")]
        for path, name in maps:
            (out / "attention").mkdir(parents=True, exist_ok=True)
            shutil.copy(path, out / "attention" / name)
    copy_device_files(sources, out)
    (out / "tables.md").write_text("\n".join(tables) + "\n")
    print(f"wrote {out / 'tables.md'}")
    from lenx.report.plot import redraw

    for path in redraw(out):
        print(path)


if __name__ == "__main__":
    main()
