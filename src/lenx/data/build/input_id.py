"""What the user's input (`lenx prepare NAME --from PATH`) was when a corpus was built from it, so that
running the same command again after the input changed is an error rather than a silent reuse.

The manifest's "input" record holds the files' count, total size and latest modification time, a
SHA-256 of every file's (path, size, mtime) -- cheap: a `stat` per file -- and a SHA-256 of their
content, read once before the build (hashing runs at about a GB/s, far faster than tokenizing, so
it adds a few percent to a build). A later run compares the stat digest first; only when that
differs (the files were touched, copied or edited) does it read the content again, so a file
touched but not changed is still the same input."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from pathlib import Path

CHUNK = 1 << 20


def _stats(files: list[Path]) -> tuple[int, int, str]:
    """(total bytes, latest mtime in ns, SHA-256 of every file's path, size and mtime)."""
    h, total, latest = hashlib.sha256(), 0, 0
    for f in files:
        st = f.stat()
        total, latest = total + st.st_size, max(latest, st.st_mtime_ns)
        h.update(f"{Path(f).resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
    return total, latest, h.hexdigest()


def _content(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f"{Path(f).resolve()}\0{f.stat().st_size}\n".encode("utf-8", "surrogateescape"))
        with open(f, "rb") as src:
            for chunk in iter(lambda: src.read(CHUNK), b""):
                h.update(chunk)
    return h.hexdigest()


def _when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).isoformat(timespec="seconds")


def input_record(files: list[Path]) -> dict:
    """The manifest's record of the input files (read in full, for their content's digest)."""
    total, latest, stat_digest = _stats(files)
    return {"files": len(files), "bytes": total, "modified": _when(latest) if files else None,
            "stat_sha256": stat_digest, "content_sha256": _content(files)}


def input_change(recorded: dict, files: list[Path]) -> str | None:
    """How the input files differ from the `recorded` input record, in words, or None when they hold
    the same content (their stat digest is the same, or else their content's)."""
    total, latest, stat_digest = _stats(files)
    if stat_digest == recorded.get("stat_sha256") or _content(files) == recorded.get("content_sha256"):
        return None
    changes = []
    if len(files) != recorded.get("files"):
        changes.append(f"{recorded.get('files')} files, now {len(files)}")
    if total != recorded.get("bytes"):
        changes.append(f"{recorded.get('bytes'):,} bytes, now {total:,}")
    if not changes:
        changes.append("the same size, another content")
    if files and _when(latest) != recorded.get("modified"):
        changes.append(f"last modified {recorded.get('modified')}, now {_when(latest)}")
    return "; ".join(changes)
