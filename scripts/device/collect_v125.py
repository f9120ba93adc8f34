"""Gather the 125M runs of issue 19 (scripts/repro/plan.py controls; copied into results/v125/<method>-s<seed>/:
config, meta, metrics and eval.json, no weights) into results/v125/results.json in the sweep's layout
(every evaluation, the training and validation loss curves), so `lenx plot results/v125` draws
perplexity.png, delta_p.png and loss.png, and `lenx compare results/v125` gives the intervals.
Usage: PYTHONPATH=src python3 scripts/device/collect_v125.py results/v125"""

import json
from pathlib import Path
import sys

from lenx.training.sweep import loss_curves

dest = Path(sys.argv[1])
run_dirs = sorted(p for p in dest.iterdir() if (p / "eval.json").exists())
runs = [json.loads((run / "eval.json").read_text()) for run in run_dirs]
curves, val_curves = loss_curves({run.name: run for run in run_dirs})
methods = sorted({r["method"] for r in runs})
(dest / "results.json").write_text(json.dumps({"methods": methods, "runs": runs, "curves": curves,
                                               "val_curves": val_curves}, indent=1))
print(f"{len(runs)} runs -> {dest / 'results.json'}")
