"""Bring the runs of scripts/device/extension_retrieval.sh into results/ext-T128: each run's config,
meta, metrics and evaluation JSON (no checkpoints, no TensorBoard), the device logs, and
extension/results.json (every perplexity evaluation, RoPE extensions labelled rope+<scaling>).
Usage: python3 scripts/device/collect_ext.py UNPACKED/runs/ext results/ext-T128; then `lenx plot results/ext-T128`."""

import json
from pathlib import Path
import shutil
import sys

src, dest = Path(sys.argv[1]), Path(sys.argv[2])
(dest / "runs").mkdir(parents=True, exist_ok=True)
for name in ("commands.txt", "jobs.log", "machine.txt", "decode_speed.json", "decode_speed.log"):
    shutil.copy(src / name, dest / name)
runs = []
for run in sorted(p for p in src.iterdir() if p.is_dir()):
    out = dest / "runs" / run.name
    out.mkdir(exist_ok=True)
    for f in run.iterdir():
        if f.is_file() and f.suffix in (".json", ".jsonl", ".toml"):
            shutil.copy(f, out / f.name)
    if run.name.startswith("rope-pi-ft"):
        # evaluate() at 635f83c labelled only the zero-shot extensions; this run was fine-tuned with
        # PI (its config.toml), so its results get the label later evaluations give (lenx.evaluation.evaluate.run_label)
        for f in out.glob("eval*.json"):
            data = json.loads(f.read_text())
            f.write_text(json.dumps(data | {"label": "rope+pi fine-tuned"}, indent=2))
    for f in sorted(out.glob("eval*.json")):
        data = json.loads(f.read_text())
        if "results" in data:
            runs.append(data)
(dest / "extension").mkdir(exist_ok=True)
(dest / "extension" / "results.json").write_text(json.dumps({"runs": runs}, indent=1))
print(f"{len(runs)} perplexity evaluations -> {dest / 'extension' / 'results.json'}")
