"""The figures of notes/code_corpus.md, from a prepared corpus's manifest and document index.

    PYTHONPATH=src python scripts/data/code_corpus_stats.py code --root data [--json stats.json]

Prints, as markdown: the sources (package, version, documents, characters), what the kernel tree's
file rule kept and dropped, cleaning (exact duplicates), the non-text and near-duplicate filters,
every split's documents, tokens and characters, and the length distribution of the test split's
long documents (>= the manifest's long_test min_tokens, else 16385 tokens).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from lenx.data import SPLITS, open_corpus


def stats(name: str, root: Path) -> dict:
    c = open_corpus(name, root)
    m = c.manifest
    out = {"sources": [], "splits": {}, "cleaning": m.get("cleaning"), "long_test": m.get("long_test")}
    for s in m["sources"]:
        files = [{k: f[k] for k in ("package", "version") if k in f} | {k: f[k] for k in ("files",) if k in f}
                 for f in s["files"]]
        out["sources"].append({"name": s["name"], "docs": s["docs"], "chars": s["chars"], "files": files})
    for key in ("non_text", "near_dup"):
        r = m.get(key) or {}
        out[key] = {k: r.get(k) for k in ("docs_checked", "docs_dropped", "chars_dropped")}
    for split in SPLITS:
        lens = c.docs(split)[:, 1]
        out["splits"][split] = {"docs": int(len(lens)), "tokens": int(m["splits"][split]["tokens"]),
                                "chars": int(m["splits"][split]["chars"]),
                                "median_doc_tokens": int(np.median(lens)) if len(lens) else 0}
    min_tokens = (m.get("long_test") or {}).get("min_tokens", 16385)
    lens = np.sort(c.docs("test")[:, 1])
    long = lens[lens >= min_tokens]
    edges = [min_tokens, 32768, 65536, 131072, 262144, None]
    bins = {f"{a}-{b - 1 if b else 'inf'}": int(((long >= a) & ((long < b) if b else True)).sum())
            for a, b in zip(edges[:-1], edges[1:])}
    out["long_test_docs"] = {
        "min_tokens": int(min_tokens), "count": int(len(long)), "tokens": int(long.sum()),
        "percentiles": {p: int(np.percentile(long, p)) for p in (0, 10, 25, 50, 75, 90, 100)} if len(long) else {},
        "bins": bins}
    return out


def markdown(s: dict) -> str:
    rows = ["| source | packages | documents | characters |", "|---|---|---|---|"]
    for src in s["sources"]:
        pk = ", ".join(f"{f['package']} {f['version']}" for f in src["files"])
        rows.append(f"| {src['name']} | {pk} | {src['docs']:,} | {src['chars']:,} |")
    rows += ["", "| split | documents | tokens | characters | median document (tokens) |", "|---|---|---|---|---|"]
    for split, r in s["splits"].items():
        rows.append(f"| {split} | {r['docs']:,} | {r['tokens']:,} | {r['chars']:,} | {r['median_doc_tokens']:,} |")
    lt = s["long_test_docs"]
    rows += ["", f"Test documents of >= {lt['min_tokens']:,} tokens: {lt['count']:,} ({lt['tokens']:,} tokens); "
             "percentiles of their length: " + ", ".join(f"p{p} {v:,}" for p, v in lt["percentiles"].items()),
             "", "| tokens | documents |", "|---|---|"]
    rows += [f"| {k} | {v:,} |" for k, v in lt["bins"].items()]
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("--root", type=Path, default=Path("data"))
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    s = stats(args.name, args.root)
    print(markdown(s))
    for key in ("cleaning", "non_text", "near_dup", "long_test"):
        print(f"{key}: {json.dumps(s[key])}")
    for src in s["sources"]:
        for f in src["files"]:
            if "files" in f:
                print(f"{f['package']} files: {json.dumps(f['files'])}")
    if args.json:
        args.json.write_text(json.dumps(s, indent=1) + "\n")


if __name__ == "__main__":
    main()
