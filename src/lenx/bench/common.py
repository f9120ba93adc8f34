"""What the kernel, training-step and decode benchmarks share: out-of-memory as a result, their
JSON output (marked as bench's, written whole, never over a file bench did not write), and the
document ids of a packed window (--documents)."""

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


def check_documents(documents: int, seq_len: int, option: str = "--documents") -> None:
    """A one-line ConfigError unless 1 <= documents <= seq_len (one token a document at most)."""
    if not 1 <= documents <= seq_len:
        raise ConfigError(f"{option} packs each window of {seq_len} tokens from 1 to {seq_len} documents, "
                          f"not {documents}")


def packed_document_ids(batch: int, seq_len: int, documents: int, draw: int = 0) -> torch.Tensor:
    """Document ids [batch, seq_len] (int64, on the CPU) of windows each packed from `documents`
    documents: every row cut at documents - 1 distinct places drawn from a generator seeded with
    `draw` (the same draw gives the same ids), ids 0, 1, ... in order. Their positions restart per
    document as lenx.attention.masks.positions makes them, as train.documents=masked does."""
    check_documents(documents, seq_len, "documents")
    gen = torch.Generator().manual_seed(draw)
    ids = torch.zeros(batch, seq_len, dtype=torch.long)
    for row in ids:
        cuts = torch.randperm(seq_len - 1, generator=gen)[:documents - 1] + 1  # a document starts at each cut
        row[cuts] = 1
    return ids.cumsum(-1)
