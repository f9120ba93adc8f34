"""How often the claims' 95% intervals (lenx.report.stats.method_difference) hold the truth, measured
by simulation in the setting of the single-epoch runs: 64 documents with one window each, 2 or 3
seeds a method, and a seed spread from none to 8 times the documents' spread of the mean difference.

    python scripts/repro/coverage.py                    # --experiments 1000 --out results/epoch/coverage.json

The model: window NLL = a shared document effect + a method-by-document effect (sd 0.3) + a seed
effect per (method, seed) + window noise (sd 0.2); method a is worse by 0.03 nats, the truth. Each
experiment draws one data set and its interval (400 bootstrap resamples, scale nll); the coverage is
the share of experiments whose interval holds 0.03. With 1,000 experiments a coverage has a standard
error of about 0.7 percentage points. tests/report/test_stats.py checks a smaller version of this
(400 experiments per setting, 30 documents, accepting 92-99%): an acceptance band, not a measurement.
"""

import argparse
import json
from pathlib import Path
import sys

import numpy as np

from lenx.report.stats import method_difference

DOCUMENTS, SD_INTER, SD_NOISE, DELTA = 64, 0.3, 0.2, 0.03
RATIOS = (0, 0.5, 1, 2, 4, 8)


def simulated(rng, seeds: int, sd_seed: float):
    doc = rng.normal(0, 0.5, DOCUMENTS)

    def method(mu):
        inter = rng.normal(0, SD_INTER, DOCUMENTS)
        return mu + doc + inter + rng.normal(0, sd_seed, (seeds, 1)) + rng.normal(0, SD_NOISE, (seeds, DOCUMENTS))

    return method(DELTA), method(0.0)


def coverage(seeds: int, ratio: float, experiments: int) -> float:
    """The share of experiments whose interval holds the truth, with the seeds' spread of the mean
    difference `ratio` times the documents'."""
    doc_sd = np.sqrt(2 * SD_INTER ** 2 / DOCUMENTS + 2 * SD_NOISE ** 2 / (DOCUMENTS * seeds))
    sd_seed = ratio * doc_sd / np.sqrt(2 / seeds)
    rng = np.random.default_rng([seeds, int(ratio * 10)])
    docs = np.arange(DOCUMENTS)
    hits = 0
    for _ in range(experiments):
        a, b = simulated(rng, seeds, sd_seed)
        r = method_difference(a, b, docs, n=400, seed=int(rng.integers(1 << 30)), scale="nll")
        hits += r["lo"] <= DELTA <= r["hi"]
    return hits / experiments


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiments", type=int, default=1000, help="simulated experiments per setting")
    p.add_argument("--out", type=Path, default=Path("results/epoch/coverage.json"), help="where to write")
    args = p.parse_args(argv)
    if args.experiments < 10:
        print(f"error: --experiments must be at least 10, got {args.experiments}", file=sys.stderr)
        return 2
    if not args.out.parent.is_dir():
        print(f"error: --out {args.out}: no folder {args.out.parent}", file=sys.stderr)
        return 2
    rows = [{"seeds": s, "seed_to_document_ratio": r, "coverage": coverage(s, r, args.experiments)}
            for s in (2, 3) for r in RATIOS]
    cover = [row["coverage"] for row in rows]
    report = {"written_by": "scripts/repro/coverage.py", "level": 0.95, "documents": DOCUMENTS,
              "experiments": args.experiments, "resamples": 400, "rows": rows, "min": min(cover), "max": max(cover)}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}: coverage {min(cover):.1%}-{max(cover):.1%} at 95%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
