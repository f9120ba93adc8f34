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


def umask() -> int:
    """The process's umask (reading it means setting it: put back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_mode(path: Path) -> None:
    """Give the file `path` the permissions a new file gets (0666 less the umask). Some writers
    (safetensors) create their file readable by its owner only, whatever the umask."""
    os.chmod(path, 0o666 & ~umask())


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temp path to write; it becomes `path` only if the block succeeds, with the
    permissions of any new file (default_mode), whatever wrote it."""
    path = Path(path)
    tmp = tmp_name(path)
    try:
        yield tmp
        default_mode(tmp)
        os.replace(tmp, path)
    finally:
        # On success the temp is already gone; on failure never leave it behind.
        tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2) + "\n")


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (one of another user's counts): a hidden build folder named after
    a live process belongs to a command still at work, not to a killed one."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class OutputError(Exception):
    """An output path that cannot be written; the CLI reports it in one line before any work."""


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_writable_dir(path: Path, what: str) -> None:
    """Raise OutputError unless `path` is a folder that can be written, or one that can be created
    (its nearest existing ancestor is a writable folder). Creates nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path} is a file, not a folder")
    _check_base(path, what)


def _check_base(path: Path, what: str, shown: Path | None = None) -> None:
    """`path` (a folder, existing or not; the one of `shown`) can be created or written."""
    base, path = _nearest_existing(path), shown or path
    if not base.is_dir():
        raise OutputError(f"cannot write {what} {path}: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {what} {path}: {base} is not writable (permission denied)")


def check_writable_file(path: Path, what: str) -> None:
    """Raise OutputError unless `path` is a file that can be written (an existing writable file, or a
    new one in a folder that can be written or created). Creates nothing."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{what} {path} is a folder, not a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"cannot write {what} {path}: the file is not writable (permission denied)")
    _check_base(path.parent, what, shown=path)


def written_by(path: Path, marker: str, keys: set[str]) -> bool:
    """Whether `path` holds a JSON object a lenx command wrote: its "written_by" is `marker`, or (files
    from before the marker) it has every one of `keys`. A command replaces only such a file."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and (data.get("written_by") == marker or keys <= set(data))
