"""What the test windows of the single-epoch tables are made of (issue 44): every table of
results/epoch scores the same 64 windows, and this says which documents they come from and, as far
as the committed files allow, from which domain.

    python scripts/repro/windows_epoch.py                 # --results results/epoch

writes <results>/windows.md and windows.json. The committed eval.json files keep each window's
document as its index in the test split; domains_epoch.py --corpus read each one's opening in the
rebuilt corpus and wrote its domain to <results>/window_domains.json, which this script reads:
- each window's domain, counted;
- the pool the windows are drawn from: the 527 test documents of at least 16,385 tokens, by the same
  rule;
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
    domains = json.loads((results / "window_domains.json").read_text())
    if list(documents) != domains["window_documents"]:
        raise ValueError("window_domains.json names other windows than the runs score; make it again with "
                         "domains_epoch.py --corpus")
    total, drawn = sum(domains["pool"].values()), len(documents)
    expected = {}
    for domain, k in domains["pool"].items():
        law = scipy.stats.hypergeom(total, k, drawn)
        expected[domain] = {"pool": k, "expected": round(drawn * k / total, 1), "range_95": [int(law.ppf(0.025)),
                                                                                               int(law.ppf(0.975))],
                            "windows": domains["window_domains"].count(domain)}
    per_token = np.asarray(g["bytes"]) / g["scored"]
    return {"written_by": "scripts/repro/windows_epoch.py", "runs": len(g["runs"]),
            "tables": sorted({r.split("/")[1] for r in g["runs"]}, key=lambda t: int(t[1:])), "split": split, "eval_seed": eval_seed,
            "windows": drawn, "documents": len(set(documents)), "window_documents": list(documents),
            "pool": expected, "bytes_per_token": {"min": round(float(per_token.min()), 2),
                                                  "median": round(float(np.median(per_token)), 2),
                                                  "max": round(float(per_token.max()), 2),
                                                  "above_3": int((per_token > 3).sum())}}


def markdown(b: dict) -> str:
    rows = [f"| {d} | {e['pool']} | {e['expected']} | {e['range_95'][0]}-{e['range_95'][1]} | {e['windows']} |"
            for d, e in b["pool"].items()]
    t = b["bytes_per_token"]
    return "\n".join([
        "# The test windows of the single-epoch tables", "",
        f"Made by scripts/repro/windows_epoch.py. All {b['runs']} runs ({', '.join(b['tables'])}) score the same "
        f"{b['windows']} windows, from {b['documents']} documents of the `{b['split']}` split (eval seed "
        f"{b['eval_seed']}), so every table and every claim rests on these windows.", "",
        "Each window's domain is read off its document's opening in the rebuilt corpus (window_domains.json, "
        "by scripts/repro/domains_epoch.py --corpus, whose docstring states the rule). The windows are drawn "
        "uniformly, without repeats, from the pool of long test documents; the table gives each domain's "
        "count in the pool, the count to expect among the windows, and the count drawn. The tables split by "
        "domain are in domains.md.", "",
        "| domain (by the document's opening) | long test documents | expected among the windows | 95% range | "
        "windows |", "|---|--:|--:|--:|--:|", *rows, "",
        f"Bytes per scored token, by window: {t['min']}-{t['max']} (median {t['median']}); {t['above_3']} windows "
        "above 3 (the kernel tokenizes at about 2.5 characters a token).", ""])


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
