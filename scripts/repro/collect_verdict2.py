"""Turn what came back from the device for the verdict2 plan (plan.py verdict2: the newer methods and
layouts at T 512, issue 44 part 4, and the epoch verdict's five methods with the adopted recipe warm10
at T 512 and 2048, part 2; runs/verdict2, unpacked) into results/verdict2, adding to the runs already
there:

    python scripts/repro/collect_verdict2.py <unpacked>/runs/verdict2 --session sessionNN   # --out results/verdict2

- runs/T512/<name>-s<seed>/, runs/T2048/<name>-s<seed>/: each finished planned run's small files (config, meta, metrics, eval.json
  with the per-position loss, command, log) and the suite files its job writes (eval_ruler.json,
  eval_babilong.json). A run is finished when eval.json says it trained every step and every file its
  job's evaluations write is there; any other run is named and left out (its checkpoint went with the
  machine, so the next machine runs it again). A run is copied beside its old copy and swapped in whole;
- device/<session>/: the scheduler's files (plan, status, scheduler log, machine);
- done.txt: the plan ids of the finished runs under --out, for the next machine
  (`SKIP=results/verdict2/done.txt PLAN=verdict2 bash scripts/repro/device.sh SECONDS`);
- compare.json, compare.md (and compare_per_position.png where runs have per-position loss): `lenx
  compare` at T 512 of the collected runs and the recipe plan's runs the plan reuses (plan.py
  VERDICT_REUSED, read from --baselines, the recipe tree), each method named by its run name without
  the seed (rnope-swa and rope-p0.5 are RoPE by model.method), against Kerple and against RoPE where
  their runs exist; compare_T2048.json, compare_T2048.md (and its _per_position.png) the same at T 2048;
- claims.md, claims.json and REPORT.md's verdict2 summary: `claims_epoch.py --plan verdict2 --results OUT`.
"""

import argparse
import json
import os
from pathlib import Path
import re
import shutil
import sys

from claims_epoch import ClaimsError, load_claims, tally, write_claims
from claims_plans import identity, job_config, load_planned, verdict2_plan
from collect import DEVICE_FILES, KEEP, finished as evaluated_to_the_end, load_run
from plan import verdict2

from lenx.config import load_config
from lenx.report.compare import MIN_RESAMPLES, CompareError, compare_runs
from lenx.report.compare_tables import compare_report
from lenx.report.positions import draw_compare
from lenx.report.tables import to_markdown

LENGTHS = ("T512", "T2048")
REFERENCES = ("kerple", "rope")  # the bias DAPE V2 builds on, and the position code most newer methods change


def planned_jobs() -> dict[str, dict]:
    """T<T>/<run name> -> its job, with "files": the evaluation files its commands write."""
    jobs = {}
    for job in verdict2():
        tasks = re.findall(r"--task (\S+)", job["cmd"])
        jobs["/".join(Path(job["run"]).parts[-2:])] = job | {"files": ["eval.json", *(f"eval_{t}.json" for t in tasks)]}
    return jobs


def unfinished(run: Path, job: dict) -> str | None:
    """Why `run` is not a finished run of `job`, or None."""
    try:
        r = load_run(run)  # None when metrics.jsonl stops before the last step
    except (OSError, ValueError, KeyError) as e:  # a folder cut off mid-write
        return f"unreadable: {e}"
    if r is None or not r["results"] or not evaluated_to_the_end(run):
        return "not trained and evaluated to the end"
    for name in job["files"][1:]:
        try:
            json.loads((run / name).read_text())
        except (OSError, ValueError):
            return f"no readable {name}"
    return None


def check_config(run: Path, job: dict) -> str | None:
    """A one-line error when `run` holds another configuration than its planned job's."""
    try:
        got = identity(load_config(str(run / "config.toml")))
    except (OSError, ValueError) as e:  # lenx.config.ConfigError is a ValueError
        return f"{run}/config.toml is not readable ({e})"
    want = identity(job_config(job))
    odd = [f"{key} = {got[key]!r} (planned {want[key]!r})" for key in want if got[key] != want[key]]
    return f"{run} is not the planned {run.name}: its config has {', '.join(odd)}" if odd else None


def copy_run(run: Path, dest: Path, files: list[str]) -> None:
    """The run's kept files into `dest`, built beside it and swapped in, so no copy is ever half there."""
    part, old = dest.with_name(f".{dest.name}.part"), dest.with_name(f".{dest.name}.old")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    for name in dict.fromkeys((*KEEP, *files)):
        if (run / name).exists():
            shutil.copy(run / name, part / name)
    if dest.exists():
        dest.rename(old)
    part.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def compare(out: Path, baselines: Path, resamples: int, T: int = 512, stem: str = "compare") -> list[str]:
    """<stem>.json / <stem>.md / <stem>_per_position.png of every finished planned run at training
    length T, the reused recipe runs among them; the references compared against."""
    groups = load_planned(verdict2_plan(out, baselines)[T], T)
    runs = [Path(r["run"]) for members in groups.values() for r in members]
    labels = [method for method, members in groups.items() for _ in members]
    done, sections, text = [], {}, [f"# The verdict2 runs at T {T}", "",
                                    f"Made by scripts/repro/collect_verdict2.py from runs/T{T}/*/eval.json and the "
                                    f"recipe runs it reuses ({os.path.relpath(baselines, out)}/runs/T{T}); the "
                                    f"numbers are in {stem}.json.", ""]
    for reference in REFERENCES:
        if reference not in groups or len(groups) < 2:
            continue
        result = compare_runs(runs, reference=reference, n=resamples, labels=labels)
        if not done:
            draw_compare(result, out / f"{stem}_per_position.png")
        for r in result["runs"]:
            r["run"] = os.path.relpath(r["run"], out)
        for m in result["methods"].values():
            m["runs"] = [os.path.relpath(p, out) for p in m["runs"]]
        sections[reference] = result
        text += [f"## Every method against {reference}", ""]
        text += [to_markdown(t) if not isinstance(t, str) else t + "\n" for t in compare_report(result)]
        done.append(reference)
    if done:
        (out / f"{stem}.json").write_text(json.dumps(sections, indent=1))
        (out / f"{stem}.md").write_text("\n".join(text))
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", type=Path,
                   help="the device's runs/verdict2 as it came back (T512/<run>, T2048/<run>, status.json)")
    p.add_argument("--session", required=True, help="a name for this device session (its files go to device/<name>)")
    p.add_argument("--out", type=Path, default=Path("results/verdict2"), help="the results tree, updated in place")
    p.add_argument("--baselines", type=Path, default=None,
                   help="the recipe results tree, where the runs the plan reuses are (default: OUT/../recipe)")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples of `lenx compare` and the claims")
    args = p.parse_args(argv)
    src, out = args.source, args.out
    baselines = args.baselines or out.parent / "recipe"

    def fail(message: str) -> int:
        print(f"error: {message}", file=sys.stderr)
        return 2

    if not src.is_dir():
        return fail(f"not a folder: {src}")
    if not (any((src / T).is_dir() for T in LENGTHS) or (src / "status.json").is_file()):
        hint = src / "runs" / "verdict2"
        return fail(f"not a device tree of the verdict2 plan (T512/<run>, T2048/<run>, status.json): {src}"
                    + (f" (did you mean {hint}?)" if any((hint / T).is_dir() for T in LENGTHS) else ""))
    try:
        ids = [job["id"] for job in json.loads((src / "plan.json").read_text())]
    except (OSError, ValueError, TypeError, KeyError):
        ids = []
    if any(not str(i).startswith("verdict2/") for i in ids):
        return fail(f"{src} is the device tree of another plan (its plan.json lists {ids[0]})")
    if out.resolve() == src.resolve() or out.resolve() in src.resolve().parents:
        return fail(f"{src} is inside --out {out}: give the device tree as it came back")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.session):
        return fail(f"--session takes a plain folder name, got {args.session}")
    if not baselines.is_dir():
        return fail(f"--baselines {baselines} is not a folder (the recipe results tree)")
    if args.resamples < MIN_RESAMPLES:
        return fail(f"--resamples must be at least {MIN_RESAMPLES}, got {args.resamples}")
    claims_path = out / "claims.toml"
    try:  # a bad claims.toml stops the collector before it writes anything
        claims = load_claims(claims_path, verdict2_plan(out, baselines), "verdict2") if claims_path.is_file() else None
    except ClaimsError as e:
        return fail(str(e))

    jobs = planned_jobs()
    found = []
    for run in sorted(d for T in LENGTHS for d in (src / T).glob("*") if d.is_dir()):
        key = f"{run.parent.name}/{run.name}"
        if key not in jobs:
            print(f"not in plan.py's verdict2 plan, left out: {run}")
            continue
        why = unfinished(run, jobs[key])
        if why:
            print(f"not finished ({why}), left out: {run}")
            continue
        wrong = check_config(run, jobs[key])
        if wrong:
            return fail(wrong)
        found.append((run, key))

    for run, key in found:
        copy_run(run, out / "runs" / key, jobs[key]["files"])
    device = out / "device" / args.session
    device.mkdir(parents=True, exist_ok=True)
    for name in DEVICE_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, device / name)
    done = [job["id"] for key, job in jobs.items()
            if (out / "runs" / key).is_dir() and unfinished(out / "runs" / key, job) is None]
    (out / "done.txt").write_text("".join(f"{i}\n" for i in done))
    print(f"copied {len(found)} finished runs; wrote {out / 'done.txt'} ({len(done)} of {len(jobs)} planned runs done)")
    try:
        for T, stem in ((512, "compare"), (2048, "compare_T2048")):
            references = compare(out, baselines, args.resamples, T, stem)
            print(f"wrote {out / (stem + '.md')} (against {', '.join(references)})" if references
                  else f"note: fewer than two methods with finished runs at T {T}, so no comparison there")
        if claims is None:
            print(f"note: no {claims_path}, so no claims table")
            return 0
        report = write_claims(out, claims_path, args.resamples, checked=claims, which="verdict2", baselines=baselines)
    except CompareError as e:
        return fail(str(e))
    print(f"wrote {out / 'claims.md'} ({tally(report)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
