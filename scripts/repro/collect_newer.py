"""The first look at the newer methods (issue 42, item 6) and the evaluation example (issue 43): what
plan.py's `newer` plan brought back from the device, into results/newer.

    python scripts/repro/collect_newer.py <unpacked>/runs/newer --session sessionNN   # --out results/newer

Copies each finished run's config, meta, metrics, evaluations (perplexity with the per-position loss,
and the suite files of the baselines' seed 0), command and log; the scheduler's files under
device/<session>; done.txt for the next machine. Then `lenx compare` of every method against Kerple
(compare.json, compare.txt: perplexity, ΔP and differences with 95% intervals over documents and
seeds, effective lengths, the per-position curves in compare_per_position.png) and `lenx plot` of
each suite file (one lengths x depths heatmap per task, beside it).
"""

import argparse
import os
from pathlib import Path
import shutil
import subprocess
import sys

from collect import DEVICE_FILES, KEEP, finished

SUITE = ("eval_ruler.json", "eval_babilong.json")
LOGS = ("suite.log",)  # the suite commands when they ran apart from the plan's job



def collect(source: Path, out: Path, session: str) -> list[Path]:
    runs = []
    for run in sorted((source / "T128").glob("*")):
        if not finished(run):
            print(f"not finished, left out: {run.name}")
            continue
        dest = out / "runs" / "T128" / run.name
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for name in (*KEEP, *SUITE, *LOGS):
            if (run / name).exists():
                shutil.copy(run / name, dest / name)
        runs.append(dest)
    dev = out / "device" / session
    dev.mkdir(parents=True, exist_ok=True)
    for name in DEVICE_FILES:
        if (source / name).exists():
            shutil.copy(source / name, dev / name)
    done = sorted(f"T128/{r.name}" for r in (out / "runs" / "T128").glob("*") if finished(r))
    (out / "done.txt").write_text("".join(d + "\n" for d in done))
    return runs


def lenx(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True,
                            env={**os.environ, "COLUMNS": "160"})
    if result.returncode != 0:
        raise SystemExit(f"lenx {' '.join(args)} failed:\n{result.stderr[-2000:]}")
    return result.stdout


def main():
    p = argparse.ArgumentParser()
    p.add_argument("source", type=Path, help="the device's runs/newer")
    p.add_argument("--session", required=True)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "results" / "newer")
    args = p.parse_args()
    runs = collect(args.source, args.out, args.session)
    print(f"{len(runs)} finished runs in {args.out / 'runs' / 'T128'}")
    table = lenx("compare", str(args.out / "runs" / "T128"), "--reference", "kerple", "--out",
                 str(args.out / "compare.json"), "--force")
    (args.out / "compare.txt").write_text(table)
    for run in runs:
        for name in SUITE:
            if (run / name).exists():
                lenx("plot", str(run / name))


if __name__ == "__main__":
    main()
