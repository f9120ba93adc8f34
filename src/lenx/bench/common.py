"""What the kernel, training-step and decode benchmarks share: out-of-memory as a result, and their
JSON output (marked as bench's, written whole, never over a file bench did not write)."""

import json
from pathlib import Path

import torch

from ..config import ConfigError
from ..fileio import write_text, written_by

WRITTEN_BY = "lenx bench"  # the marker of bench's JSON: `lenx bench -o` overwrites only such a file


def is_oom(err: Exception) -> bool:
    """Whether err is an out-of-memory (or, from Triton, out-of-resources) error: a result, not a failure."""
    text = f"{type(err).__name__}: {err}".lower()
    return isinstance(err, torch.cuda.OutOfMemoryError) or any(
        s in text for s in ("out of memory", "outofresources", "out of resource"))


def is_bench_output(path: Path) -> bool:
    """Whether `path` holds JSON that `lenx bench` wrote: its marker, or (before the marker) the keys
    every benchmark always wrote."""
    return written_by(path, WRITTEN_BY, {"device", "torch", "git_commit", "command", "started", "rows"})


def check_out(out: Path, named: bool, force: bool) -> None:
    """Whether bench may write `out` (as `lenx compare` decides for its file): a new file; a file of an
    earlier benchmark when the user named it (--out) or passed --force; never a file bench did not write."""
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give a file name such as {out / 'bench.json'}")
    if not out.exists() and not out.is_symlink():
        return
    if not is_bench_output(out):
        raise ConfigError(f"{out} exists and was not written by lenx bench; lenx does not overwrite it: "
                          "choose another --out, or move that file away")
    if not named and not force:
        raise ConfigError(f"{out} holds an earlier benchmark; pass --force to replace it, or --out FILE to "
                          "write this one elsewhere")


def write_result(path, result: dict) -> None:
    """The result as JSON at `path`, whole or not at all (it is rewritten after every row)."""
    write_text(Path(path), json.dumps({"written_by": WRITTEN_BY, **result}, indent=1))
