"""The T 2048 recipe diagnosis of issue 44 (plan.py recipe): what came back from the device into
results/recipe, and a table of each recipe against the epoch recipe and against the method trained at 512.

    python scripts/repro/recipe_t2048.py runs/recipe --session session21   # --out results/recipe

The epoch recipe (results/epoch/runs/T2048/kerple-s0: lr 6e-4, warm-up 1% = 30 steps, 16 x 2048)
trails its T 512 counterpart by 0.4-0.5 nats of training loss over steps 100-1000. Each recipe run
changes one setting (plan.py RECIPES) on the same data, steps and evaluation; the plan's runs at
T 2048 and T 512 (runs/T2048, runs/T512) are read alike. The table gives, per method, length and
recipe: the mean training loss over steps 100-1000, 1000-2000 and the last 200 steps (the logged
steps, every 50th), the validation loss at steps 250, 1000 and the last, and the perplexity at each
evaluated length with its 95% interval over the 64 documents; then each recipe minus the epoch recipe
(same method, length and seeds: results/epoch's runs and the plan's own seeds of it) and each T 2048
row minus the method trained at 512 with the epoch recipe (its seeds) and with its own recipe where
that ran, at each length both scored, with intervals (lenx.report.stats; † where a side has one
seed: documents only).
"""

import argparse
import json
from pathlib import Path
import re
import shutil
import sys

import numpy as np

from collect import DEVICE_FILES, KEEP, finished
from plan import RECIPES

from lenx.report.stats import method_difference, method_interval

EPOCH = Path(__file__).resolve().parents[2] / "results" / "epoch" / "runs"
LENGTHS = ("T2048", "T512")


def collect(source: Path, out: Path, session: str) -> list[str]:
    """Copy the finished runs of a device tree (T2048/<run>, T512/<run>) and its scheduler's files;
    the ids done."""
    for T in LENGTHS:
        for run in sorted((source / T).glob("*")):
            if finished(run):
                dest = out / "runs" / T / run.name
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir(parents=True)
                for name in (*KEEP, "eval_ruler.json", "eval_babilong.json"):  # the suite, where the run scored it
                    if (run / name).exists():
                        shutil.copy(run / name, dest / name)
    dev = out / "device" / session
    dev.mkdir(parents=True, exist_ok=True)
    for name in DEVICE_FILES:
        if (source / name).exists():
            shutil.copy(source / name, dev / name)
    done = sorted(f"recipe/{T}/{r.name}" for T in LENGTHS for r in (out / "runs" / T).glob("*") if finished(r))
    (out / "done.txt").write_text("".join(d + "\n" for d in done))
    return done


def seeds_of(runs: list[Path]) -> list[Path]:
    return sorted(runs, key=lambda r: r.name[-2:])


def groups(out: Path) -> dict:
    """{(T, method, recipe or None): runs}: the plan's runs, and the epoch recipe's runs of results/epoch
    for each (T, method) the plan has a recipe of, or of T 512 for a T 2048 method (the comparison)."""
    found = {}
    for T in LENGTHS:
        for run in sorted((out / "runs" / T).glob("*")):
            name = re.sub(r"-s\d+$", "", run.name)
            recipe = next((r for r in RECIPES if name.endswith("-" + r)), None)
            method = name[: -len(recipe) - 1] if recipe else name
            found.setdefault((T, method, recipe), []).append(run)
    for T, method in {(T, m) for T, m, _ in found} | {("T512", m) for T, m, _ in found if T == "T2048"}:
        found.setdefault((T, method, None), []).extend(sorted((EPOCH / T).glob(f"{method}-s[0-9]")))
    return {k: seeds_of(v) for k, v in found.items() if v}


def curve(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = rows[-1]["step"]

    def mean(a, b):
        return float(np.mean([r["loss"] for r in rows if a <= r["step"] <= b and "loss" in r]))

    val = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    return {"train_loss_100_1000": mean(100, 1000), "train_loss_1000_2000": mean(1000, 2000),
            "train_loss_last_200": mean(last - 200, last), "val_loss": {str(s): val[s] for s in (250, 1000, last) if s in val}}


def nll(runs: list[Path], length: str) -> np.ndarray | None:
    evals = [json.loads((r / "eval.json").read_text())["results"] for r in runs]
    if any(length not in e for e in evals):
        return None
    return np.array([e[length]["window_nll"] for e in evals])


def label(T: str, method: str, recipe: str | None) -> str:
    return f"{method} {T} {recipe or 'epoch recipe'}"


def table(out: Path, resamples: int) -> dict:
    found = groups(out)
    first = next(iter(found.values()))[0]
    docs = np.asarray(json.loads((first / "eval.json").read_text())["window_documents"])
    order = sorted(found, key=lambda k: (k[1], -int(k[0][1:]), k[2] is not None, k[2] or ""))
    rows = {}
    for T, method, recipe in order:
        runs = found[(T, method, recipe)]
        lengths = json.loads((runs[0] / "eval.json").read_text())["lengths"]
        row = {"runs": [str(r.relative_to(r.parents[3])) for r in runs], "seeds": len(runs),
               "curves": {r.name: curve(r) for r in runs}, "lengths": {}}
        base = [r for r in found.get((T, method, None), []) if r.name[-2:] in {x.name[-2:] for x in runs}]
        short = found.get(("T512", method, None)) if T == "T2048" else None
        same = found.get(("T512", method, recipe)) if T == "T2048" and recipe else None
        for L in map(str, lengths):
            a = nll(runs, L)
            if a is None:
                continue
            cell = {"ppl": method_interval(a, docs, n=resamples)}
            if recipe and base and nll(base, L) is not None:
                cell["minus epoch recipe"] = method_difference(a, nll(base, L), docs, n=resamples)
            if short and nll(short, L) is not None:
                cell["minus T512"] = method_difference(a, nll(short, L), docs, n=resamples)
            if same and nll(same, L) is not None:
                cell["minus T512 same recipe"] = method_difference(a, nll(same, L), docs, n=resamples)
            row["lengths"][L] = cell
        rows[label(T, method, recipe)] = row
    return {"written_by": "scripts/repro/recipe_t2048.py", "resamples": resamples, "windows": len(docs), "recipes": rows}


def _iv(d: dict, key: str = "diff") -> str:
    dag = "†" if "only" in d.get("covers", "") else ""
    return f"{d[key]:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]{dag}"


def markdown(t: dict) -> str:
    recipes = t["recipes"]
    lengths = sorted({L for r in recipes.values() for L in r["lengths"]}, key=int)
    lines = ["# The T 2048 recipe (issue 44)", "",
             "Made by scripts/repro/recipe_t2048.py. 125M, 3052 steps of 32,768 tokens (16 x 2048 at T 2048, "
             "64 x 512 at T 512) on the `code` corpus (the epoch runs' data, steps and evaluation); each recipe "
             "changes one setting of the epoch recipe (lr 6e-4, warm-up 1%). 95% intervals over the 64 documents "
             "and the seeds († one seed: documents only). Every recipe figure here rests on the seeds listed; one "
             "seed is one seed.", "",
             "| method, length, recipe | seeds | train loss 100-1000 | 1000-2000 | last 200 | val loss 250 | 1000 | last |",
             "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for name, r in recipes.items():
        cs = list(r["curves"].values())

        def m(key, sub=None):
            v = [c[key] if sub is None else c[key].get(sub) for c in cs]
            return f"{np.mean(v):.3f}" if all(x is not None for x in v) else "-"
        last = max(cs[0]["val_loss"], key=int)
        lines.append(f"| {name} | {r['seeds']} | {m('train_loss_100_1000')} | {m('train_loss_1000_2000')} | "
                     f"{m('train_loss_last_200')} | {m('val_loss', '250')} | {m('val_loss', '1000')} | {m('val_loss', last)} |")

    def cells(r, fmt):
        return " | ".join(fmt(r["lengths"][L]) if L in r["lengths"] else "-" for L in lengths)

    lines += ["", "Perplexity at each length:", "", "| method, length, recipe | " + " | ".join(lengths) + " |",
              "|---|" + "--:|" * len(lengths)]
    for name, r in recipes.items():
        lines.append(f"| {name} | " + cells(r, lambda c: f"{c['ppl']['value']:.3f} [{c['ppl']['lo']:.3f}, "
                                                        f"{c['ppl']['hi']:.3f}]") + " |")
    for key, title in (("minus epoch recipe", "Minus the epoch recipe (same method, length and seeds)"),
                       ("minus T512", "Minus the same method trained at 512 with the epoch recipe (its seeds), "
                                      "the same tokens"),
                       ("minus T512 same recipe", "Minus the same method trained at 512 with the same recipe (its "
                                                  "seeds), the same tokens")):
        lines += ["", f"{title}, perplexity:", "", "| method, length, recipe | " + " | ".join(lengths) + " |",
                  "|---|" + "--:|" * len(lengths)]
        for name, r in recipes.items():
            if any(key in c for c in r["lengths"].values()):
                lines.append(f"| {name} | " + cells(r, lambda c: _iv(c[key]) if key in c else "-") + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", type=Path, nargs="*", help="device trees (runs/recipe as it came back)")
    p.add_argument("--session", action="append", default=[], help="the device session of each source, in order")
    p.add_argument("--out", type=Path, default=Path("results/recipe"))
    p.add_argument("--resamples", type=int, default=2000)
    args = p.parse_args(argv)
    if len(args.session) != len(args.sources):
        print("error: give one --session per source", file=sys.stderr)
        return 2
    for src in args.sources:
        if not any((src / T).is_dir() for T in LENGTHS):
            print(f"error: {src} is not a device tree of the recipe plan (no T2048 or T512 folder)", file=sys.stderr)
            return 2
    for src, session in zip(args.sources, args.session):
        print(f"{src}: {len(collect(src, args.out, session))} runs done in {args.out}")
    if not any((args.out / "runs" / T).is_dir() for T in LENGTHS):
        print(f"error: {args.out} has no runs yet", file=sys.stderr)
        return 2
    t = table(args.out, args.resamples)
    (args.out / "recipe.json").write_text(json.dumps(t, indent=1) + "\n")
    (args.out / "recipe.md").write_text(markdown(t))
    print(f"wrote {args.out / 'recipe.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
