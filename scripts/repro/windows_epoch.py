"""What the test windows of the single-epoch tables are made of (issue 44): every table of
results/epoch scores the same 64 windows, and this says which documents they come from and, as far
as the committed files allow, from which domain.

    python scripts/repro/windows_epoch.py                 # --results results/epoch

writes <results>/windows.md and windows.json. The committed eval.json files keep each window's
document as its index in the test split, which the corpus build shuffles (splits.split_members), so
the window's source (a kernel file, LaTeX, prose) is not recoverable from them: a per-window domain
breakdown needs the test split's member list, which no committed file holds. What can be said:
- the pool the windows are drawn from: the 527 test documents of at least 16,385 tokens, by their
  opening (notes/code_corpus.md's heuristic): POOL below;
- the windows are drawn uniformly from that pool without repeats (lenx.evaluation.evaluate.
  eval_windows_with_documents), so each domain's count among the 64 follows the hypergeometric law:
  its expected count and 95% range;
- bytes per scored token of each window (eval.json's window_bytes): the kernel tokenizes at about
  2.5 characters a token, so this spread hints at, but does not establish, the mix.
"""

import argparse
import json
from pathlib import Path
import sys

import numpy as np

# notes/code_corpus.md, "Splits and the long-document test split": the 527 long test documents by their opening
POOL = {"kernel files": 461, "LaTeX": 22, "POD": 6, "reStructuredText": 6, "prose and other": 32}


def windows_of(results: Path) -> dict:
    """{table: [run folders]} grouped by the windows they score; a ValueError when a table's runs differ."""
    groups = {}
    for ev in sorted((results / "runs").glob("T*/*/eval.json")):
        e = json.loads(ev.read_text())
        key = (tuple(e["window_documents"]), e["eval_seed"], e["split"])
        groups.setdefault(key, {"bytes": e["window_bytes"]["scored"], "scored": e["scored"], "runs": []})
        groups[key]["runs"].append(str(ev.parent.relative_to(results)))
    return groups


def breakdown(results: Path) -> dict:
    import scipy.stats

    groups = windows_of(results)
    if len(groups) != 1:
        raise ValueError(f"the runs score {len(groups)} different sets of windows; each table needs its own breakdown")
    (documents, eval_seed, split), g = next(iter(groups.items()))
    total, drawn = sum(POOL.values()), len(documents)
    expected = {}
    for domain, k in POOL.items():
        law = scipy.stats.hypergeom(total, k, drawn)
        expected[domain] = {"pool": k, "expected": round(drawn * k / total, 1), "range_95": [int(law.ppf(0.025)),
                                                                                               int(law.ppf(0.975))]}
    per_token = np.asarray(g["bytes"]) / g["scored"]
    return {"written_by": "scripts/repro/windows_epoch.py", "runs": len(g["runs"]),
            "tables": sorted({r.split("/")[1] for r in g["runs"]}, key=lambda t: int(t[1:])), "split": split, "eval_seed": eval_seed,
            "windows": drawn, "documents": len(set(documents)), "window_documents": list(documents),
            "pool": expected, "bytes_per_token": {"min": round(float(per_token.min()), 2),
                                                  "median": round(float(np.median(per_token)), 2),
                                                  "max": round(float(per_token.max()), 2),
                                                  "above_3": int((per_token > 3).sum())},
            "missing": "the test split's member list (document index -> source file) is in no committed file; "
                       "the corpus build computes it (splits.split_members) and a rebuild of `code` gives it back"}


def markdown(b: dict) -> str:
    rows = [f"| {d} | {e['pool']} | {e['expected']} | {e['range_95'][0]}-{e['range_95'][1]} |" for d, e in b["pool"].items()]
    t = b["bytes_per_token"]
    return "\n".join([
        "# The test windows of the single-epoch tables", "",
        f"Made by scripts/repro/windows_epoch.py. All {b['runs']} runs ({', '.join(b['tables'])}) score the same "
        f"{b['windows']} windows, from {b['documents']} documents of the `{b['split']}` split (eval seed "
        f"{b['eval_seed']}), so every table and every claim rests on these windows.", "",
        "Per-window domain: **not recoverable from the committed files**: " + b["missing"] + ". What follows is "
        "what can be said without it: the domains of the pool the windows are drawn from (uniformly, without "
        "repeats), and the count of each to expect among the windows.", "",
        "| domain (by the document's opening) | long test documents | expected among the windows | 95% range |",
        "|---|--:|--:|--:|", *rows, "",
        f"Bytes per scored token, by window: {t['min']}-{t['max']} (median {t['median']}); {t['above_3']} windows "
        "above 3 (the kernel tokenizes at about 2.5 characters a token, so these are the likeliest non-kernel "
        "windows; a hint, not a classification).", ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=Path("results/epoch"), help="the results tree (runs/<T>/<run>)")
    args = p.parse_args(argv)
    if not (args.results / "runs").is_dir():
        print(f"error: --results {args.results} has no runs folder", file=sys.stderr)
        return 2
    try:
        b = breakdown(args.results)
    except (ValueError, KeyError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    (args.results / "windows.json").write_text(json.dumps(b, indent=1) + "\n")
    (args.results / "windows.md").write_text(markdown(b))
    print(f"wrote {args.results / 'windows.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
