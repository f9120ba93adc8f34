"""Per-document statistics of a built-in corpus, behind the non-text filter (notes/data_filter.md).

    PYTHONPATH=src python scripts/data/non_text_stats.py tech --root data [--json tech_stats.json]

Reads the corpus's documents as `lenx prepare` does (from the download cache under ROOT/.cache,
fetching what is missing), cleaned but not filtered, and places each in its split as a corpus
prepared with the default settings and --keep-non-text (or before the filter existed) has it: the
index there is the document id evaluation reports (eval.json's window_documents). For every
document it computes the filter's non-text share and, for comparison, characters per token under
ROOT/NAME/tokenizer.json (when that corpus exists), the share of letters and whitespace, the
longest run without whitespace, the share of lines over 200 characters and the zlib ratio; it
prints each statistic's percentiles and the documents at its extremes.
"""

from __future__ import annotations

import argparse
import json
import re
import zlib
from pathlib import Path

import numpy as np

from lenx.data.build.documents import read_docs
from lenx.data.build.fetch import Registries
from lenx.data.build.nontext import MAX_SHARE, non_text_share
from lenx.data.build.splits import split_docs, split_members

# (name, larger is less text-like)
STATS = (("non_text_share", True), ("chars_per_token", False), ("letters_whitespace", False),
         ("longest_run", True), ("lines_over_200", True), ("zlib_ratio", True), ("replacement_chars", True))


def doc_stats(text: str, n_tokens: int | None) -> dict:
    lines = text.split("\n")
    data = text.encode("utf-8", "surrogatepass")
    return {"chars": len(text), "non_text_share": non_text_share(text),
            "chars_per_token": len(text) / max(n_tokens, 1) if n_tokens is not None else None,
            "letters_whitespace": sum(c.isalpha() or c.isspace() for c in text) / len(text),
            "longest_run": max((len(m) for m in re.findall(r"\S+", text)), default=0),
            "lines_over_200": sum(len(x) > 200 for x in lines) / len(lines),
            "zlib_ratio": len(zlib.compress(data, 6)) / len(data),
            "replacement_chars": text.count("\ufffd") / len(text)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=("tech", "books"))
    ap.add_argument("--root", type=Path, default=Path("data"))
    ap.add_argument("--json", type=Path, help="also write every document's statistics here")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()

    docs = read_docs(args.name, None, Registries(args.root / ".cache"), False, False)[0]
    members = split_members(split_docs(np.array([len(t) for _, t in docs]), 0, 0.02, 0.05), 0)
    where = {int(i): (split, k) for split, m in members.items() for k, i in enumerate(m)}
    tokens = [None] * len(docs)
    tok_path = args.root / args.name / "tokenizer.json"
    if tok_path.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_path))
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
        tokens = [len(e.ids) for e in encode([t for _, t in docs], add_special_tokens=False)]
    rows = [{"doc": d, "split": where[i][0], "index": where[i][1], **doc_stats(t, tokens[i])}
            for i, (d, t) in enumerate(docs)]

    print(f"{args.name}: {len(rows)} documents; non-text (share >= {MAX_SHARE}):",
          [(r["split"], r["index"], round(r["non_text_share"], 4), r["doc"]) for r in rows
           if r["non_text_share"] >= MAX_SHARE])
    for key, high in STATS:
        v = np.array([r[key] for r in rows if r[key] is not None], dtype=float)
        if not len(v):
            continue
        pct = np.percentile(v, [0, 0.1, 1, 50, 99, 99.9, 100]).round(4).tolist()
        print(f"\n{key}: {int((v == 0).sum())} documents at 0; percentiles 0/0.1/1/50/99/99.9/100: {pct}")
        ranked = sorted((r for r in rows if r[key] is not None), key=lambda r: r[key], reverse=high)
        for r in ranked[: args.top]:
            print(f"  {r[key]:.4g}  {r['split']}:{r['index']}  {r['chars']} chars  {r['doc']}")
    if args.json:
        args.json.write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
