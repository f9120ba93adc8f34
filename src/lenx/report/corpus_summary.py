"""What `lenx prepare` prints: a short summary of the corpus (stdout: its name and tokenizer, one
line per split, where its manifest is), and one line per source whose bad records were skipped
(stderr). The manifest itself stays in its file."""


def corpus_summary(manifest: dict, manifest_path) -> list[str]:
    """The corpus's name, tokenizer and vocabulary; one line per split (split_summary); the manifest's path."""
    tokenizer = manifest.get("tokenizer", {})
    head = f"corpus {manifest.get('name', '?')}"
    if tokenizer.get("kind") == "none":
        head += f": token-level (no tokenizer), vocabulary of {tokenizer.get('vocab_size', 0):,} tokens"
    elif tokenizer:
        head += f": {tokenizer.get('kind', '?')} tokenizer, vocabulary of {tokenizer.get('vocab_size', 0):,} tokens"
    return [head, *split_summary(manifest), f"manifest: {manifest_path}"]


def split_summary(manifest: dict) -> list[str]:
    """One line per split of a corpus manifest: documents, tokens and long documents."""
    lines = []
    reserved = manifest.get("long_test")
    for split, stats in manifest.get("splits", {}).items():
        line = f"{split}: {stats['docs']:,} document{'' if stats['docs'] == 1 else 's'}, {stats['tokens']:,} tokens"
        long = [f"{v:,} of >= {k.split('_')[2]} tokens" for k, v in stats.items()
                if k.startswith("docs_ge_") and k.endswith("_tokens")]
        if long:
            line += "; " + ", ".join(long)
        if split == "test" and reserved:
            line += (f" ({reserved['reserved_docs']:,} reserved by --long-test, "
                     f"{reserved['reserved_docs_ge_min_tokens']:,} of them >= {reserved['min_tokens']} tokens)")
        lines.append(line)
    return lines


def skipped_records(manifest: dict, shown=None) -> list[str]:
    """One line per source with records left out by --skip-bad-records: how many, and the first ones
    (the lines of a JSONL file, or the records of other inputs by file and row); `shown`: the input's
    path as the user gave it (the manifest records it absolute)."""
    lines = []
    for source in manifest.get("sources", []):
        skipped = source.get("bad_records_skipped", 0)
        if skipped:
            s = "s" if skipped != 1 else ""
            if "bad_record_lines" in source:
                listed, what = source["bad_record_lines"], f"line{s} "
            else:
                listed, what = source.get("bad_records", []), ""
            more = ", ..." if skipped > len(listed) else ""
            lines.append(f"skipped {skipped:,} bad record{s} of {shown or source.get('path')} "
                         f"(--skip-bad-records; {what}{', '.join(map(str, listed))}{more})")
    return lines
