"""Each single-epoch table split by the domain of its test windows (issue 44): are the methods' order
and gaps the same on the Linux-kernel windows as on the others (LaTeX, POD, reStructuredText, prose)?

    python scripts/repro/domains_epoch.py --corpus data/code   # once: each window's domain -> window_domains.json
    python scripts/repro/domains_epoch.py                      # the tables -> domains.md, domains.json

Every table of results/epoch scores the same 64 windows (windows_epoch.py). The committed eval.json
files name each window's document by its index in the test split; the corpus (rebuilt with
`lenx prepare code`: the same fingerprint) gives that document's text, and `domain` below reads its
opening. Its rule (the first match wins): a C, shell or device-tree opening ("/*", "//", "#include",
"#!", ...) is a kernel file; an opening "%" or "\\", or "\\documentclass" in its first 3,000
characters, is LaTeX; a POD command ("=head1", "=pod", "=encoding", ...) at a line's start is POD; a
reStructuredText directive ("..") or a heading underline is reStructuredText; a C-like line with
kernel words is a kernel file; anything else is prose and other. `--corpus` writes each window's
domain, the counts of the whole pool (the 527 long test documents) and the corpus fingerprint to
window_domains.json, so the tables are made again without the corpus.

The tables compare the kernel windows with all the others pooled (too few of each other domain to
say anything alone). Each figure is lenx.report.stats': a method's seed-mean perplexity on a subset
of the windows with its interval over those windows' documents and the seeds (method_interval), and
each method minus Kerple on the subset (method_difference; † where a method has one seed).
"""

import argparse
import json
from pathlib import Path
import re
import sys

import numpy as np

from lenx.report.stats import method_difference, method_interval

KERNEL, OTHER = "kernel files", "other"
DOMAINS = ("kernel files", "LaTeX", "POD", "reStructuredText", "prose and other")
KERNEL_OPENINGS = ("/*", "//", "#include", "# SPDX", "#!", "/dts-v1/", "#ifndef", "#define")
POD = re.compile(r"^=(head\d|pod|item|begin|encoding|over)\b", re.M)
RST = re.compile(r"^(\.\. |(=+|-+|~+)\n)", re.M)
C_LINE = re.compile(r"^\s*(#include|#define|#if|/\*|//|;)", re.M)
C_WORDS = re.compile(r"SPDX|#include|#define|Copyright|EXPORT_SYMBOL|static |struct ")


def domain(text: str) -> str:
    """A document's domain by its opening (the rule in the module's docstring)."""
    head = text[:3000]
    lead = head.lstrip()
    if lead.startswith(KERNEL_OPENINGS):
        return "kernel files"
    if lead.startswith(("%", "\\")) or "\\documentclass" in head:
        return "LaTeX"
    if POD.search(head):
        return "POD"
    if RST.search(head):
        return "reStructuredText"
    if C_LINE.search(head) and C_WORDS.search(head):
        return "kernel files"
    return "prose and other"


def runs_of(results: Path) -> dict:
    """{table: {method: [eval.json dicts, by seed]}} of every finished run under results/runs."""
    tables = {}
    for ev in sorted((results / "runs").glob("T*/*/eval.json")):
        e = json.loads(ev.read_text())
        method = re.sub(r"-s\d+$", "", ev.parent.name)
        tables.setdefault(ev.parent.parent.name, {}).setdefault(method, []).append(e)
    return dict(sorted(tables.items(), key=lambda kv: int(kv[0][1:])))


def classify(results: Path, corpus: Path) -> dict:
    """Each window's domain from the corpus's test split, checked against the runs' fingerprint."""
    from tokenizers import Tokenizer

    e = next(iter(next(iter(runs_of(results).values())).values()))[0]
    manifest = json.loads((corpus / "manifest.json").read_text())
    if manifest["fingerprint"]["test"] != e["corpus_fingerprint"]["test"]:
        raise ValueError(f"{corpus}'s test split is not the one the runs scored (fingerprints differ)")
    tok = Tokenizer.from_file(str(corpus / "tokenizer.json"))
    docs = np.load(corpus / "test.idx.npy")
    tokens = np.memmap(corpus / "test.bin", dtype=np.dtype(manifest["token_dtype"]), mode="r")

    def of(d: int) -> str:
        start = int(docs[d, 0])
        return domain(tok.decode([int(t) for t in tokens[start:start + 700]]))

    pool = np.flatnonzero(docs[:, 1] >= max(e["lengths"]) + 1)
    counts = dict.fromkeys(DOMAINS, 0)
    for d in pool:
        counts[of(int(d))] += 1
    return {"written_by": "scripts/repro/domains_epoch.py --corpus", "corpus_fingerprint": manifest["fingerprint"],
            "split": e["split"], "window_documents": e["window_documents"],
            "window_domains": [of(int(d)) for d in e["window_documents"]], "pool": counts}


def _fmt(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def tables(results: Path, domains: dict, resamples: int = 2000) -> dict:
    """Per table and length: each method's perplexity on the kernel windows and on the others, and
    each method minus Kerple on each, with their intervals."""
    kinds = np.array([KERNEL if d == KERNEL else OTHER for d in domains["window_domains"]])
    out = {"written_by": "scripts/repro/domains_epoch.py", "resamples": resamples,
           "windows": {KERNEL: int((kinds == KERNEL).sum()), OTHER: int((kinds == OTHER).sum())},
           "window_domains": {d: domains["window_domains"].count(d) for d in DOMAINS}, "tables": {}}
    for table, methods in runs_of(results).items():
        for runs in methods.values():
            if any(r["window_documents"] != domains["window_documents"] for r in runs):
                raise ValueError(f"a run of {table} scores other windows than window_domains.json's")
        docs = np.asarray(domains["window_documents"])
        rows = {}
        for method, runs in methods.items():
            for length in runs[0]["lengths"]:
                nll = np.array([r["results"][str(length)]["window_nll"] for r in runs])
                ker = methods.get("kerple")
                cell = {"seeds": len(runs)}
                for kind in (KERNEL, OTHER):
                    pick = kinds == kind
                    cell[kind] = method_interval(nll[:, pick], docs[pick], n=resamples)
                    if ker and method != "kerple":
                        base = np.array([r["results"][str(length)]["window_nll"] for r in ker])
                        cell[kind + " minus kerple"] = method_difference(nll[:, pick], base[:, pick], docs[pick],
                                                                         n=resamples)
                rows.setdefault(method, {})[str(length)] = cell
        out["tables"][table] = rows
    return out


def markdown(t: dict) -> str:
    w = t["windows"]
    lines = ["# The single-epoch tables by the domain of their windows", "",
             f"Made by scripts/repro/domains_epoch.py from window_domains.json. Of the 64 windows {w[KERNEL]} are "
             f"Linux-kernel files and {w[OTHER]} are not ("
             + ", ".join(f"{n} {d}" for d, n in t["window_domains"].items() if d != KERNEL and n) + "). "
             "Perplexity on each subset, seed mean, with its 95% interval over the subset's documents and the "
             "seeds; then each method minus Kerple on the same subset († one seed: documents only). The "
             f"{w[OTHER]} other windows make wide intervals: read the sign and the order, not small gaps.", ""]
    for table, rows in t["tables"].items():
        lengths = list(next(iter(rows.values())))
        lines += [f"## {table}", "", "Perplexity, kernel windows | other windows:", "",
                  "| method | " + " | ".join(lengths) + " |", "|---|" + "--:|" * len(lengths)]
        for method, cells in rows.items():
            lines.append(f"| {method} | " + " | ".join(
                f"{_fmt(c[KERNEL]['value'])} \\| {_fmt(c[OTHER]['value'])}" for c in cells.values()) + " |")
        lines += ["", "Minus Kerple, kernel windows | other windows [95% interval]:", "",
                  "| method | " + " | ".join(lengths) + " |", "|---|" + "--:|" * len(lengths)]
        for method, cells in rows.items():
            if method == "kerple" or KERNEL + " minus kerple" not in next(iter(cells.values())):
                continue
            parts = []
            for c in cells.values():
                k, o = c[KERNEL + " minus kerple"], c[OTHER + " minus kerple"]
                dag = "†" if "only" in k["covers"] else ""
                flip = " **sign differs**" if (k["lo"] > 0 and o["hi"] < 0) or (k["hi"] < 0 and o["lo"] > 0) else ""
                parts.append(f"{k['diff']:+.2f} [{k['lo']:+.2f}, {k['hi']:+.2f}]{dag} \\| "
                             f"{o['diff']:+.2f} [{o['lo']:+.2f}, {o['hi']:+.2f}]{dag}{flip}")
            lines.append(f"| {method} | " + " | ".join(parts) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=Path("results/epoch"), help="the results tree (runs/<T>/<run>)")
    p.add_argument("--corpus", type=Path, help="the rebuilt `code` corpus folder: classify the windows first")
    p.add_argument("--resamples", type=int, default=2000)
    args = p.parse_args(argv)
    if not (args.results / "runs").is_dir():
        print(f"error: --results {args.results} has no runs folder", file=sys.stderr)
        return 2
    store = args.results / "window_domains.json"
    try:
        if args.corpus is not None:
            if not (args.corpus / "manifest.json").is_file():
                raise ValueError(f"--corpus {args.corpus} is not a prepared corpus (no manifest.json)")
            store.write_text(json.dumps(classify(args.results, args.corpus), indent=1) + "\n")
        if not store.is_file():
            raise ValueError(f"{store} is missing; make it once with --corpus (the rebuilt `code` corpus)")
        t = tables(args.results, json.loads(store.read_text()), args.resamples)
    except (ValueError, KeyError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    (args.results / "domains.json").write_text(json.dumps(t, indent=1) + "\n")
    (args.results / "domains.md").write_text(markdown(t))
    print(f"wrote {args.results / 'domains.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
