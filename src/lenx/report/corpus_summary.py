"""What `lenx prepare` prints: the corpus manifest as JSON (stdout), and for a person one line per
split and one per source whose bad records were skipped (stderr)."""

import json


def manifest_json(manifest: dict) -> str:
    """The manifest without its sources, as indented JSON."""
    return json.dumps({k: v for k, v in manifest.items() if k != "sources"}, indent=2)


def split_summary(manifest: dict) -> list[str]:
    """One line per split of a corpus manifest: documents, tokens and long documents."""
    lines = []
    reserved = manifest.get("long_test")
    for split, stats in manifest.get("splits", {}).items():
        line = f"{split}: {stats['docs']:,} documents, {stats['tokens']:,} tokens"
        long = [f"{v:,} of >= {k.split('_')[2]} tokens" for k, v in stats.items()
                if k.startswith("docs_ge_") and k.endswith("_tokens")]
        if long:
            line += "; " + ", ".join(long)
        if split == "test" and reserved:
            line += (f" ({reserved['reserved_docs']:,} reserved by --long-test, "
                     f"{reserved['reserved_docs_ge_min_tokens']:,} of them >= {reserved['min_tokens']} tokens)")
        lines.append(line)
    return lines


def skipped_records(manifest: dict) -> list[str]:
    """One line per source with records left out by --skip-bad-records: how many, and the first ones
    (the lines of a JSONL file, or the records of other inputs by file and row)."""
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
            lines.append(f"skipped {skipped:,} bad record{s} of {source.get('path')} "
                         f"(--skip-bad-records; {what}{', '.join(map(str, listed))}{more})")
    return lines
