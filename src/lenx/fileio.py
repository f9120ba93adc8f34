"""Small file helpers: atomic writes (a file is whole or absent, never half written) and hashing."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

TMP_MARK = ".tmp-"


def tmp_name(path: Path) -> Path:
    """A temp name in the same directory, so os.replace is atomic (same filesystem)."""
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temp path to write; it becomes `path` only if the block succeeds."""
    path = Path(path)
    tmp = tmp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        # On success the temp is already gone; on failure never leave it behind.
        tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2) + "\n")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
