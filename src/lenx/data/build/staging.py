"""Building a corpus folder aside and swapping it in whole, so that a failed or killed prepare
leaves the corpus that was there as it was."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ...fileio import pid_alive


@contextmanager
def build_aside(folder: Path) -> Iterator[Path]:
    """A new empty folder `.<name>.build-<pid>` beside `folder` to build the corpus in; it replaces
    `folder` when the block ends without an error, and is deleted otherwise."""
    # Build next to the real folder (through a symlink, if `folder` is one), so the
    # final renames stay on one filesystem.
    real = folder.resolve()
    real.parent.mkdir(parents=True, exist_ok=True)
    _clean_dead_builds(real)
    build = real.with_name(f".{real.name}.build-{os.getpid()}")
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir()
    try:
        yield build
        _swap_in(build, real)
    finally:
        shutil.rmtree(build, ignore_errors=True)  # gone already after a successful swap



def _clean_dead_builds(folder: Path) -> None:
    """Tidy the hidden siblings that a killed prepare of `folder` left behind: drop its
    build folder, and put the old corpus back if it died in the middle of the swap."""
    pattern = re.compile(rf"\.{re.escape(folder.name)}\.(build|old)-(\d+)")
    for p in folder.parent.glob(f".{folder.name}.*-*"):
        m = pattern.fullmatch(p.name)
        if not m or pid_alive(int(m.group(2))):
            continue
        if m.group(1) == "old" and not folder.exists():
            os.rename(p, folder)
        else:
            shutil.rmtree(p, ignore_errors=True)


def _swap_in(build: Path, folder: Path) -> None:
    """Replace `folder` with the finished `build`: rename the old one aside, the new one in,
    then delete the old one, so a corpus is only ever missing between two renames."""
    if not folder.exists():
        os.rename(build, folder)
        return
    old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    os.rename(folder, old)
    try:
        os.rename(build, folder)
    except BaseException:
        os.rename(old, folder)
        raise
    shutil.rmtree(old)
