"""Turn what came back from the device for the recipe plan (plan.py recipe: runs/recipe, unpacked) into
results/epoch/recipe, adding to the runs already there, and set each recipe against the handicapped T 2048
run it repairs (results/epoch/runs/T2048/<method>-s0: lr 6e-4, a 30-step warm-up, 16 x 2048 from step 0):

    python scripts/repro/collect_recipe.py runs/recipe --session session21a   # --out results/epoch/recipe

- runs/T2048/<run>/ and device/<session>/: as collect_epoch.py keeps them;
- results.json: every finished recipe run's eval.json with its recipe, seed, command, final loss,
  meta.json's corpus and epochs, and device time; the loss curves apart;
- recipe.md and recipe.json: (1) the training loss averaged over the logged steps of the audit's bins
  (100-500, 550-1000, ...; science-2026-11-28.md section 3), the gradient norm over 550-1000 and the
  validation loss at 500, 1000 and the end, each recipe (seed mean) beside the handicapped run and Kerple
  trained at 512 on the same tokens; (2) the final evaluation: `lenx compare` of each recipe against the
  handicapped run (intervals over documents and seeds; documents only on its one-seed side), and each
  recipe minus the same method trained at 512, at every length both evaluated (the audit's question:
  does the repaired recipe still lose to T 512 at 2048?);
- done.txt: the plan ids of the finished runs (device.sh's PLAN=recipe skips them on the next machine).

A SOURCE is a device tree (runs/recipe as it came back: T2048/<run>, status.json) or an earlier results
tree (runs/T2048/<run>, done.txt); the last finished copy of a run wins.
"""

import argparse
import json
import os
from pathlib import Path
import re
import statistics
import sys

from claims_epoch import load_length
from collect_epoch import (copy_device_files, copy_run, device_times, find_runs, finished, is_device_tree,
                           is_results_tree, markdown, run_record)
from plan import RECIPES, recipe

from lenx.report.compare import MIN_RESAMPLES, CompareError, compare_runs, load_run
from lenx.report.compare_tables import compare_report
from lenx.report.stats import method_difference
from lenx.report.tables import Table, columns, to_markdown

BINS = ((100, 500), (550, 1000), (1050, 1500), (1550, 2000), (2550, 3050))  # the audit's, steps inclusive
GRAD_BIN = (550, 1000)
VAL_STEPS = (500, 1000)
HANDICAPPED = "epoch"  # the label suffix of results/epoch's run: "kerple epoch"


def recipe_of(run: Path) -> tuple[str, str]:
    """(method, recipe) of a recipe run folder, <method>-<recipe>-s<seed>."""
    for name in RECIPES:
        m = re.fullmatch(rf"(.+)-{re.escape(name)}-s\d+", run.name)
        if m:
            return m.group(1), name
    raise CompareError(f"{run} is not a recipe run (<method>-<recipe>-s<seed>, recipes {', '.join(RECIPES)})")


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def curve_summary(run: Path) -> dict:
    """The training loss averaged over each bin's logged steps, the gradient norm over GRAD_BIN, the
    validation loss at VAL_STEPS and the last."""
    records = metrics(run)

    def mean(key, lo, hi):
        values = [r[key] for r in records if lo <= r["step"] <= hi and key in r]
        return statistics.fmean(values) if values else None

    val = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    return {"loss": {f"{lo}-{hi}": mean("loss", lo, hi) for lo, hi in BINS},
            "grad_norm": {f"{GRAD_BIN[0]}-{GRAD_BIN[1]}": mean("grad_norm", *GRAD_BIN)},
            "val_loss": {**{str(s): val.get(s) for s in VAL_STEPS}, "final": val[max(val)] if val else None}}


def seed_mean(summaries: list[dict]) -> dict:
    def avg(values):
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else None

    return {part: {k: avg([s[part][k] for s in summaries]) for k in summaries[0][part]} for part in summaries[0]}


def curve_table(rows: list[tuple[str, int, dict]], reference: dict) -> Table:
    """rows: (label, seeds, seed-mean summary); each cell with its difference to `reference`."""
    def cell(v, ref):
        if v is None:
            return ""
        return f"{v:.3f}" if ref is None else f"{v:.3f} ({v - ref:+.2f})"

    keys = [(part, k) for part in ("loss", "grad_norm", "val_loss") for k in reference[part]]
    heads = [f"loss {k}" if p == "loss" else f"grad norm {k}" if p == "grad_norm" else f"val {k}" for p, k in keys]
    table = Table("training loss (mean of the logged steps of each bin), gradient norm and validation loss "
                  "(at T 512 on 512-token windows: not shown); (±): minus the handicapped T 2048 run",
                  columns("run", "seeds", *heads, right_from=2))
    for label, seeds, s in rows:
        short = " T 512 " in label
        table.add_row(label, seeds, *("" if short and p == "val_loss" else
                                      cell(s[p][k], None if s is reference else reference[p][k]) for p, k in keys))
    return table


def collect(out: Path, epoch: Path, resamples: int) -> tuple[list[str], dict]:
    """results.json, recipe.json and recipe.md from out/runs/T2048 and the epoch runs they are set
    against; the names of the finished recipe runs."""
    order = {job["run"].split("/")[-1]: i for i, job in enumerate(recipe())}
    runs = sorted((r for r in (out / "runs" / "T2048").glob("*") if finished(r) is not None),
                  key=lambda r: (order.get(r.name, len(order)), r.name))
    if not runs:
        return [], {}
    times = device_times(out)
    records = []
    for run in runs:
        method, name = recipe_of(run)
        record = run_record(run, finished(run), times) | {"method": method, "recipe": name,
                                                           "label": f"{method} {name}", "change": list(RECIPES[name])}
        records.append(record)
    curves = {f"{r['label']} s{r['seed']}": r.pop("curve") for r in records}
    (out / "results.json").write_text(json.dumps({"experiment": "recipe/T2048", "train_len": 2048, "runs": records,
                                                  "curves": curves}, indent=1))
    report = {"note": "issue 44 part 2: each recipe against the handicapped T 2048 run", "methods": {}}
    lines = ["# The T 2048 recipe (issue 44 part 2)", "",
             "Made by scripts/repro/collect_recipe.py from runs/T2048/*/ and the epoch runs in "
             f"{epoch}; the numbers are in recipe.json. Each recipe changes one thing of the epoch plan's T 2048 "
             "recipe (lr 6e-4, a 30-step warm-up, 16 x 2048 from step 0): "
             + "; ".join(f"`{n}` {', '.join(c)}" for n, c in RECIPES.items())
             + ". The sequence-length warm-up's training loss before step 305 is at 512 or 1024 tokens of context; "
               "its validation loss is at 2048 throughout.", ""]
    for method in dict.fromkeys(r["method"] for r in records):
        mine = [(run, r) for run, r in zip(runs, records) if r["method"] == method]
        handicapped = epoch / "runs" / "T2048" / f"{method}-s0"
        if finished(handicapped) is None:
            raise CompareError(f"no finished {handicapped} to set the {method} recipes against")
        ref_label = f"{method} {HANDICAPPED}"
        short = load_length(epoch, 512).get(method, [])
        rows, summaries = [], {}
        for label, folders in [(f"{method} T 512 (epoch)", [Path(r["run"]) for r in short]),
                               (ref_label, [handicapped])] + \
                [(f"{method} {n}", [run for run, r in mine if r["recipe"] == n]) for n in RECIPES]:
            if folders:
                each = [curve_summary(f) for f in folders]
                summaries[label] = seed_mean(each)
                rows.append((label, str(len(folders)), summaries[label]))
                if len(folders) > 1 and label != f"{method} T 512 (epoch)":  # a recipe's seeds one by one
                    rows += [(f"{label} s{r['seed']}", "1", e) for r, e in
                             zip([r for _, r in mine if r["label"] == label], each)]
        lines += [f"## {method}: the loss curve", "", to_markdown(curve_table(rows, summaries[ref_label]))]
        compared = compare_runs([handicapped] + [run for run, _ in mine], reference=ref_label, n=resamples,
                                labels=[ref_label] + [r["label"] for _, r in mine])
        lines += [f"## {method}: the final evaluation against the handicapped run", ""]
        lines += markdown(compare_report(compared))
        across = against_short(mine, short, resamples)
        if across:
            lines += [f"## {method}: each recipe minus {method} trained at 512 (the same tokens)", "",
                      to_markdown(across_table(across))]
        report["methods"][method] = {"curves": summaries, "compare": relative_to(compared, out),
                                     "against_T512": across}
    (out / "recipe.json").write_text(json.dumps(report, indent=1))
    (out / "recipe.md").write_text("\n".join(lines))
    return [run.name for run in runs], report


def relative_to(result: dict, out: Path) -> dict:
    """compare_runs' run paths relative to --out (runs/T2048/kerple-warm10-s0, ../runs/T2048/kerple-s0)."""
    def rel(path: str) -> str:
        return os.path.relpath(path, out)

    for r in result["runs"]:
        r["run"] = rel(r["run"])
    for m in result["methods"].values():
        m["runs"] = [rel(p) for p in m["runs"]]
    return result


def same_windows(run: dict) -> dict:
    """What must match for two training lengths to be compared window by window (not the lengths)."""
    return {k: v for k, v in run["windows"].items() if k != "lengths"}


def against_short(mine: list, short: list[dict], resamples: int) -> list[dict]:
    """Each recipe (its seeds) minus the method trained at 512 (its seeds) at every length both evaluated."""
    if not short:
        return []
    rows = []
    for name in RECIPES:
        long = [load_run(run, name) for run, r in mine if r["recipe"] == name]
        if not long:
            continue
        if same_windows(long[0]) != same_windows(short[0]):
            raise CompareError(f"{long[0]['run']} was evaluated on other windows than {short[0]['run']}")
        for L in sorted(set(long[0]["nll"]) & set(short[0]["nll"])):
            d = method_difference([r["nll"][L] for r in long], [r["nll"][L] for r in short],
                                  short[0]["windows"]["window_documents"], n=resamples)
            rows.append({"recipe": name, "length": L, "seeds": [len(long), len(short)], **d})
    return rows


def across_table(rows: list[dict]) -> Table:
    lengths = sorted({r["length"] for r in rows})
    table = Table("perplexity of the recipe at T 2048 minus the method trained at 512, seed means [95% interval over "
                  "seeds and documents; †: a side has one seed, so documents only]",
                  columns("recipe", "seeds", *map(str, lengths), right_from=2))
    for name in dict.fromkeys(r["recipe"] for r in rows):
        cells = {r["length"]: r for r in rows if r["recipe"] == name}
        first = next(iter(cells.values()))
        table.add_row(name, f"{first['seeds'][0]} vs {first['seeds'][1]}",
                      *(f"{c['diff']:+.2f} [{c['lo']:+.2f}, {c['hi']:+.2f}]"
                        + ("" if c["covers"] == "seeds and documents" else "†") if (c := cells.get(L)) else ""
                        for L in lengths))
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", type=Path, nargs="+", help="device trees (runs/recipe as it came back) and/or an "
                   "earlier results/epoch/recipe; the last finished copy of a run wins")
    p.add_argument("--out", type=Path, default=Path("results/epoch/recipe"), help="the results tree (may be a source)")
    p.add_argument("--epoch", type=Path, default=None, help="the epoch results the recipes are set against "
                   "(default: the folder above --out)")
    p.add_argument("--session", action="append", default=[],
                   help="a name for each device tree, in order (its files go to device/<name>)")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples of `lenx compare`")
    args = p.parse_args(argv)
    epoch = args.epoch or args.out.parent
    missing = [str(s) for s in args.sources if not s.is_dir()]
    if missing:
        print(f"error: not a folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    odd = [s for s in args.sources if not is_device_tree(s) and not is_results_tree(s)]
    if odd:
        print(f"error: neither a device tree (runs/recipe: T2048/<run>, status.json) nor a results tree "
              f"(runs/T2048/<run>, done.txt): {', '.join(map(str, odd))}", file=sys.stderr)
        return 2
    trees = [s for s in args.sources if is_device_tree(s)]
    if len(args.session) != len(trees):
        print(f"error: {len(trees)} device trees ({', '.join(map(str, trees)) or 'none'}) need as many --session "
              f"names, got {len(args.session)}", file=sys.stderr)
        return 2
    bad = [s for s in args.session if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", s)]
    if bad:
        print(f"error: --session takes a plain folder name, got {', '.join(bad)}", file=sys.stderr)
        return 2
    if args.resamples < MIN_RESAMPLES:
        print(f"error: --resamples must be at least {MIN_RESAMPLES}, got {args.resamples}", file=sys.stderr)
        return 2
    if not (epoch / "runs" / "T2048").is_dir():
        print(f"error: {epoch} holds no runs/T2048 to set the recipes against (give --epoch)", file=sys.stderr)
        return 2
    found = find_runs(args.sources)
    odd = sorted(str(run) for (T, _), run in found.items() if T != "T2048" or not any(
        re.fullmatch(rf".+-{re.escape(n)}-s\d+", run.name) for n in RECIPES))
    if odd:
        print(f"error: not recipe runs at T 2048: {', '.join(odd)}", file=sys.stderr)
        return 2
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    for (T, name), run in found.items():
        copy_run(run, out / "runs" / T / name)
    copy_device_files(args.sources, args.session, out)
    try:
        names, _ = collect(out, epoch, args.resamples)
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if names:
        print(f"wrote {out / 'recipe.md'} ({len(names)} runs)")
    planned = {job["run"].split("/")[-1]: job["id"] for r in [None, *RECIPES] for job in recipe(r)}
    (out / "done.txt").write_text("".join(f"{planned[n]}\n" for n in dict.fromkeys(planned) if n in names))
    print(f"wrote {out / 'done.txt'} ({len(set(names) & set(planned))} planned runs done)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
