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
    """One line per source with records left out by --skip-bad-records: how many, and their lines."""
    lines = []
    for source in manifest.get("sources", []):
        skipped = source.get("bad_records_skipped", 0)
        if skipped:
            numbers = source.get("bad_record_lines", [])
            more = ", ..." if skipped > len(numbers) else ""
            s = "s" if skipped != 1 else ""
            lines.append(f"skipped {skipped:,} bad record{s} of {source.get('path')} "
                         f"(--skip-bad-records; line{s} {', '.join(map(str, numbers))}{more})")
    return lines
