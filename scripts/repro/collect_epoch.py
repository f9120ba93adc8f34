"""Turn what came back from the device for the epoch plan (plan.py epoch: runs/epoch, unpacked) into
results/epoch, adding to the runs already there:

    python scripts/repro/collect_epoch.py runs/epoch --session session17    # --out results/epoch

- runs/<T>/<run>/: each finished run's small files (config, meta, metrics, eval.json, command, log);
- device/<session>/: each device tree's plan, status, scheduler log and nvidia-smi (--session names
  the device trees in the order they are given);
- <T>/results.json (T128, T512, T2048): every finished run's eval.json with its seed, label, command,
  final loss, tokens/s, meta.json's corpus, sampling and epochs, its environment, and its device time
  (device_time: seconds, GPU, session) from the status.json of the session that ran it; the loss
  curves apart;
- <T>/compare.json and <T>/tables.md: `lenx compare` of those runs (seed-mean perplexity with 95%
  intervals over documents; differences to Kerple with intervals over seeds and documents; at T 128
  the capacity control again against DAPE-Kerple D 64; DAPE V2 against DAPE where both ran), and a
  training table;
- across.json and across.md: a method trained at T 128 or 512 minus the same method trained at 2048, at each
  length both evaluated (intervals over seeds and documents);
- done.txt: the plan ids of the finished runs (device.sh's PLAN=epoch skips them on the next machine);
- claims.md and claims.json: the claims of claims.toml (when --out has one) tested on all the runs
  (claims_epoch.py; claims.toml is checked before anything is written).

A SOURCE is a device tree (runs/epoch as it came back: T128/<run>, status.json, ...) or another
results tree (runs/T128/<run>, device/<session>/, done.txt). A run counts once it has trained every
step and been evaluated; of a run in several sources, the last finished copy wins, and it replaces
the copy under --out. --out (default results/epoch) is updated in place: the runs and device
sessions it holds stay, and every table is made again from all of them.
"""

import argparse
import json
from pathlib import Path
import re
import shutil
import sys
import tomllib

from claims_epoch import ClaimsError, load_claims, load_length, tally, write_claims
from collect import KEEP, load_run
from plan import EPOCH, epoch

from lenx.report.compare import MIN_RESAMPLES, CompareError, compare_runs
from lenx.report.compare_tables import compare_report
from lenx.report.stats import method_difference
from lenx.report.tables import Table, columns, to_markdown

LENGTHS = ("T128", "T512", "T2048")
DEVICE_FILES = ("plan.json", "status.json", "machine.txt", "scheduler.log")
META_KEYS = ("corpus", "sampling", "epochs", "epochs_are", "train_tokens", "params", "environment")
REFERENCE = "kerple"  # every method against the bias that DAPE and DAPE V2 are built on
CAPACITY = "dape-kerple (D=64)"  # paper section 4.6: DAPE V2 with a smaller D against DAPE with D 64
SECTIONS = (  # after "all": (compare.json key, reference, which runs by label, title) where the runs exist
    ("capacity", CAPACITY, lambda label: label.startswith("dape"),
     f"Capacity (paper section 4.6): DAPE and DAPE V2 against {CAPACITY}"),
    ("dape", "dape-kerple", lambda label: label in ("dape-kerple", "dapev2-kerple"),
     "DAPE V2 against DAPE (paper section 4.1), both with D 32"),
)


def is_results_tree(src: Path) -> bool:
    """An earlier results/epoch: runs/T128/<run>, done.txt."""
    return (src / "done.txt").is_file() or any((src / "runs" / T).is_dir() for T in LENGTHS)


def is_device_tree(src: Path) -> bool:
    """runs/epoch as it came back: T128/<run>, status.json."""
    return not is_results_tree(src) and ((src / "status.json").is_file() or any((src / T).is_dir() for T in LENGTHS))


def finished(run: Path) -> dict | None:
    """collect.load_run of a run that trained every step and was evaluated, else None."""
    try:
        r = load_run(run)
    except (OSError, ValueError, KeyError) as e:  # a folder cut off mid-write
        print(f"skipped {run}: {e}", file=sys.stderr)
        return None
    return r if r is not None and r["results"] else None


def find_runs(sources: list[Path]) -> dict[tuple[str, str], Path]:
    """(T, name) -> the run folder of the last source that holds it finished."""
    found = {}
    for src in sources:
        for T in LENGTHS:
            for run in sorted((src / T if is_device_tree(src) else src / "runs" / T).glob("*")):
                if (run / "config.toml").is_file() and finished(run) is not None:
                    found[(T, run.name)] = run
    return found


def copy_run(run: Path, dest: Path) -> None:
    if dest.resolve() == run.resolve():
        return
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in KEEP:
        if (run / name).exists():
            shutil.copy(run / name, dest / name)


def copy_device_files(sources: list[Path], sessions: list[str], out: Path) -> None:
    """A device tree's files to device/<its session>; an earlier results tree's device/* as they are."""
    names = iter(sessions)
    for src in sources:
        if is_device_tree(src):
            session, folders = next(names), [src]
        else:
            folders = sorted(d for d in (src / "device").glob("*") if d.is_dir())
        for folder in folders:
            dest = out / "device" / (session if folder == src else folder.name)
            if dest.resolve() == folder.resolve():
                continue
            dest.mkdir(parents=True, exist_ok=True)
            for name in DEVICE_FILES:
                if (folder / name).exists():
                    shutil.copy(folder / name, dest / name)


def device_times(out: Path) -> dict[tuple[str, str], dict]:
    """(T, name) -> {"seconds", "gpu", "session"} of each done job, from device/*/status.json; a run done
    in two sessions takes the later one's (status.json's "updated")."""
    statuses = []
    for path in (out / "device").glob("*/status.json"):
        status = json.loads(path.read_text())
        statuses.append((status.get("updated", 0), path.parent.name, status["jobs"]))
    times = {}
    for _, session, jobs in sorted(statuses):
        for job in jobs:
            if job.get("state") == "done":
                T, name = Path(job["run"]).parts[-2:]
                times[(T, name)] = {"seconds": job.get("seconds"), "gpu": job.get("gpu"), "session": session}
    return times


def run_record(run: Path, r: dict, times: dict) -> dict:
    """collect.load_run's record with meta.json's corpus, sampling, epochs and environment, and the
    device time of the job."""
    meta = json.loads((run / "meta.json").read_text())
    return r | {key: meta[key] for key in META_KEYS if key in meta} | {
        "device_time": times.get((run.parent.name, run.name), {"seconds": None, "gpu": None, "session": None})}


def relative_runs(result: dict, out: Path) -> dict:
    """compare_runs' run paths relative to --out (runs/T128/kerple-s0), not this machine's."""
    def rel(path: str) -> str:
        return str(Path(path).relative_to(out))

    for r in result["runs"]:
        r["run"] = rel(r["run"])
    for m in result["methods"].values():
        m["runs"] = [rel(p) for p in m["runs"]]
    return result


def markdown(items: list) -> list[str]:
    return [to_markdown(item) if isinstance(item, Table) else item + "\n" for item in items]


def compare_section(runs: list[Path], labels: list[str], reference: str, resamples: int, out: Path) -> dict | None:
    if reference not in labels or len(set(labels)) < 2:
        return None
    return relative_runs(compare_runs(runs, reference=reference, n=resamples, labels=labels), out)


def collect_length(out: Path, T: str, times: dict, resamples: int, order: list[str]) -> list[str] | None:
    """results.json, compare.json and tables.md of one training length from the runs under
    out/runs/<T> (in plan order: `order`, the plan's run folders); its finished runs' names."""
    def rank(run: Path) -> tuple:
        key = f"{EPOCH}/{T}/{run.name}"
        return (order.index(key) if key in order else len(order), run.name)

    found = [(run, finished(run)) for run in sorted((out / "runs" / T).glob("*"), key=rank)]
    found = [(run, r) for run, r in found if r is not None]
    if not found:
        return None
    runs = [run for run, _ in found]
    records = [run_record(run, r, times) for run, r in found]
    labels = [r["label"] for r in records]
    curves = {f"{r['label']} s{r['seed']}": r.pop("curve") for r in records}
    (out / T).mkdir(exist_ok=True)
    (out / T / "results.json").write_text(json.dumps({"experiment": f"epoch/{T}", "train_len": int(T[1:]),
                                                      "runs": records, "curves": curves}, indent=1))
    train = tomllib.loads((runs[0] / "config.toml").read_text())["train"]
    tokens = train["steps"] * train["batch_size"] * train["seq_len"]
    tables = [f"# {T}: one pass over {tokens / 1e6:.1f}M tokens of `{records[0].get('corpus')}` "
              f"({train['steps']} steps of {train['batch_size']} x {train['seq_len']})", "",
              f"Made by scripts/repro/collect_epoch.py from runs/{T}/*/eval.json; the numbers are in compare.json.", ""]
    comparisons = {}
    main = compare_runs(runs, reference=REFERENCE if REFERENCE in labels else None, n=resamples, labels=labels)
    comparisons["all"] = relative_runs(main, out)
    tables += ["## Every method" + (f" against {REFERENCE}" if main["differences"] else ""), ""]
    tables += markdown(compare_report(main))
    for key, reference, takes, title in SECTIONS:
        chosen = [(run, label) for run, label in zip(runs, labels) if takes(label)]
        section = compare_section([r for r, _ in chosen], [label for _, label in chosen], reference, resamples, out)
        if section is not None:
            comparisons[key] = section
            tables += [f"## {title}", ""] + markdown(compare_report(section))
    (out / T / "compare.json").write_text(json.dumps(comparisons, indent=1))
    training = Table("final training and validation loss, tokens/s (median over logging intervals), device "
                     "time (train + eval)", columns("run", "seed", "GPU", "session", "final loss", "val loss",
                                                    "tokens/s", "epochs", "device s", right_from=4))
    for run, r in zip(runs, records):
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        val = [m["val_loss"] for m in metrics if "val_loss" in m]
        d = r["device_time"]
        training.add_row(run.name, str(r["seed"]), r.get("environment", {}).get("gpu", ""), d["session"] or "",
                         f"{r['final_train_loss']:.4f}", f"{val[-1]:.4f}" if val else "",
                         f"{r['tokens_per_s'] or 0:,.0f}", f"{r.get('epochs', '')}",
                         "" if d["seconds"] is None else f"{d['seconds']:.0f}")
    tables += ["## Training", "", to_markdown(training)]
    (out / T / "tables.md").write_text("\n".join(tables))
    return [run.name for run in runs]


def collect_across(out: Path, resamples: int) -> int:
    """across.json and across.md: each method trained at a shorter length minus the same method trained at
    the longest (T 2048), at every length both evaluated, on the same windows (the same 100M tokens spent on
    short or on long sequences). The number of pairs written (0: no method ran at two lengths)."""
    by_T = {T: load_length(out, int(T[1:])) for T in LENGTHS}  # T -> label -> its runs, seed order
    longest = LENGTHS[-1]
    rows = []
    for label, long in by_T[longest].items():
        windows = {k: v for k, v in long[0]["windows"].items() if k != "lengths"}
        for T in LENGTHS[:-1]:
            short = by_T[T].get(label, [])
            if short and {k: v for k, v in short[0]["windows"].items() if k != "lengths"} != windows:
                raise CompareError(f"{short[0]['run']} was evaluated on other windows than {long[0]['run']}")
            for L in sorted(set(long[0]["nll"]) & set(short[0]["nll"])) if short else []:
                d = method_difference([r["nll"][L] for r in short], [r["nll"][L] for r in long],
                                      windows["window_documents"], n=resamples)
                rows.append({"method": label, "trained_at": int(T[1:]), "against": int(longest[1:]),
                             "length": L, "seeds": [len(short), len(long)], **d})
    if not rows:
        return 0
    note = (f"perplexity of a method trained at T minus the same method trained at {longest[1:]}, mean over seeds "
            "[95% interval over seeds and documents; †: a side has one seed, so documents only]")
    (out / "across.json").write_text(json.dumps({"note": note, "resamples": resamples, "rows": rows}, indent=1))

    def cell(r: dict) -> str:
        mark = "" if r["covers"] == "seeds and documents" else "†"
        return f"{r['diff']:+.2f} [{r['lo']:+.2f}, {r['hi']:+.2f}]{mark}"

    lengths = sorted({r["length"] for r in rows})
    table = Table(note, columns("method", "trained at", *map(str, lengths), right_from=2))
    for method, T in dict.fromkeys((r["method"], r["trained_at"]) for r in rows):
        cells = {r["length"]: r for r in rows if (r["method"], r["trained_at"]) == (method, T)}
        seeds = next(iter(cells.values()))["seeds"][0]
        table.add_row(method, f"{T} ({seeds} seeds)", *(cell(cells[L]) if L in cells else "" for L in lengths))
    (out / "across.md").write_text("# The same tokens at two training lengths\n\nMade by "
                                   "scripts/repro/collect_epoch.py from runs/<T>/*/eval.json; the numbers are in "
                                   f"across.json.\n\n{to_markdown(table)}")
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", type=Path, nargs="+", help="device trees (runs/epoch as it came back) and/or an "
                   "earlier results/epoch; the last finished copy of a run wins")
    p.add_argument("--out", type=Path, default=Path("results/epoch"), help="the results tree (may be a source)")
    p.add_argument("--session", action="append", default=[],
                   help="a name for each device tree, in order (its files go to device/<name>)")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples of `lenx compare`")
    args = p.parse_args(argv)
    missing = [str(s) for s in args.sources if not s.is_dir()]
    if missing:
        print(f"error: not a folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    odd = [s for s in args.sources if not is_device_tree(s) and not is_results_tree(s)]
    if odd:
        hint = [str(s / "runs" / "epoch") for s in odd if is_device_tree(s / "runs" / "epoch")]
        print(f"error: neither a device tree (runs/epoch: T128/<run>, status.json) nor a results tree (runs/T128/<run>, "
              f"done.txt): {', '.join(map(str, odd))}" + (f" (did you mean {', '.join(hint)}?)" if hint else ""),
              file=sys.stderr)
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
    plan = epoch()
    out = args.out
    claims_path = out / "claims.toml"
    try:  # a bad claims.toml stops the collector before it writes anything
        claims = load_claims(claims_path) if claims_path.is_file() else None
    except ClaimsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    found = find_runs(args.sources)
    out.mkdir(parents=True, exist_ok=True)
    for (T, name), run in found.items():
        copy_run(run, out / "runs" / T / name)
    copy_device_files(args.sources, args.session, out)
    readme = [s / "README.md" for s in args.sources if (s / "README.md").is_file() and s.resolve() != out.resolve()]
    if readme and not (out / "README.md").exists():
        shutil.copy(readme[-1], out / "README.md")
    times = device_times(out)
    done = {}
    try:
        for T in LENGTHS:
            names = collect_length(out, T, times, args.resamples, [job["run"] for job in plan])
            if names:
                done.update({f"{EPOCH}/{T}/{name}": T for name in names})
                print(f"wrote {out / T / 'tables.md'} ({len(names)} runs)")
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        if collect_across(out, args.resamples):
            print(f"wrote {out / 'across.md'}")
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ids = {job["run"]: job["id"] for job in plan}
    unplanned = sorted(set(done) - set(ids))
    if unplanned:
        print(f"note: not in plan.py's epoch plan, so not in done.txt: {', '.join(unplanned)}")
    (out / "done.txt").write_text("".join(f"{ids[run]}\n" for run in ids if run in done))
    print(f"wrote {out / 'done.txt'} ({len(done) - len(unplanned)} of {len(ids)} planned runs done)")
    if claims is None:
        print(f"note: no {claims_path}, so no claims table")
        return 0
    try:
        report = write_claims(out, claims_path, args.resamples, checked=claims)
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out / 'claims.md'} ({tally(report)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
