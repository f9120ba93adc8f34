"""The files of a prepared corpus, as the reader opens them and the builder writes them.

Layout of `<root>/<name>/`:
  manifest.json             what was built, from what, and how big (written last)
  tokenizer.json            HF tokenizer (absent for `synthetic`)
  {train,val,test}.bin      token stream (uint16, or uint32 for a vocabulary over 65536 ids:
                            manifest["token_dtype"]); each document's tokens then one EOS
  {train,val,test}.idx.npy  int64 [n_docs, 2]: start offset, length (without the EOS)
  train.shards/00000.bin    after `lenx shard`: the train stream cut into consecutive pieces, listed
                            in manifest["shards"]["train"] (each one's file, start, tokens, sha256);
                            train.bin may then be gone, and a shard may be absent until it is read
                            (a machine holds the shards of the steps it trains)

A folder without a valid manifest.json counts as not prepared. A manifest without "token_dtype" (a
corpus prepared before uint32 streams existed) is uint16.

manifest["fingerprint"] pins the corpus's content: the SHA-256 of tokenizer.json and of
each split (its token stream and document index). A run records it (meta.json), and
evaluating or generating with the run refuses a corpus whose fingerprint differs
(lenx.runs.open_run_corpus). Corpora prepared before fingerprints existed get theirs
computed from their files when asked (Corpus.fingerprint).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ..fileio import sha256_file
from .errors import DataError

SPLITS = ("train", "val", "test")
FORMAT = "lenx-corpus-v1"
FINGERPRINT_PARTS = ("tokenizer",) + SPLITS
TOKEN_DTYPES = ("uint16", "uint32")


def dtype_for_vocab(vocab_size: int) -> str:
    """The narrowest token dtype that holds every id below `vocab_size`."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def token_dtype(m: dict) -> np.dtype:
    """The dtype of a manifest's token streams."""
    return np.dtype(m.get("token_dtype", "uint16"))


def tokens_file(folder: Path, split: str) -> Path:
    return Path(folder) / f"{split}.bin"


def index_file(folder: Path, split: str) -> Path:
    return Path(folder) / f"{split}.idx.npy"


def shards_dir(folder: Path, split: str) -> Path:
    return Path(folder) / f"{split}.shards"


def shard_records(m: dict, split: str) -> list[dict] | None:
    """The shards of a split as the manifest lists them ({"file", "start", "tokens", "sha256"}, in
    stream order), or None when the split is one file."""
    entry = m.get("shards", {}).get(split) if isinstance(m.get("shards"), dict) else None
    return entry["files"] if isinstance(entry, dict) and isinstance(entry.get("files"), list) else None


def corrupt(name: str, folder: Path, what: str) -> DataError:
    """The error for a damaged corpus: `what` is wrong, and how to prepare it again."""
    return DataError(f"corpus {name!r} at {folder} is corrupt: {what}; "
                     f"delete that folder and run `lenx prepare {name}` again")


def read_manifest(folder: Path) -> dict | None:
    """The manifest, or None when the folder is missing or holds no valid one."""
    try:
        m = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or m.get("format") != FORMAT or not all(s in m.get("splits", {}) for s in SPLITS):
        return None
    if m.get("token_dtype", "uint16") not in TOKEN_DTYPES:
        return None  # written by a newer lenx: not a corpus this one can read
    return m


def check_files(name: str, folder: Path, m: dict) -> None:
    """Cheap consistency checks: every file there, .bin sizes as the manifest says. A sharded split
    needs no .bin (its shards are checked when read: a machine may hold only some of them)."""
    itemsize = token_dtype(m).itemsize
    for split in SPLITS:
        shards = shard_records(m, split)
        if shards is not None:
            _check_shard_records(name, folder, split, shards, m["splits"][split]["tokens"])
        for path in (tokens_file(folder, split), index_file(folder, split)):
            if not path.is_file() and not (shards is not None and path == tokens_file(folder, split)):
                raise corrupt(name, folder, f"{path.name} is missing")
        want = itemsize * m["splits"][split]["tokens"]
        if tokens_file(folder, split).is_file() and (have := tokens_file(folder, split).stat().st_size) != want:
            raise corrupt(name, folder, f"{split}.bin has {have} bytes, manifest says {want}")
    if m["tokenizer"]["kind"] != "none" and not (folder / "tokenizer.json").is_file():
        raise corrupt(name, folder, "tokenizer.json is missing")


def _check_shard_records(name: str, folder: Path, split: str, shards: list[dict], tokens: int) -> None:
    """The shards follow one another from token 0 to the split's end."""
    at = 0
    for s in shards:
        if not (isinstance(s, dict) and s.get("start") == at and isinstance(s.get("tokens"), int) and s["tokens"] > 0
                and isinstance(s.get("file"), str) and "/" not in s["file"]):
            raise corrupt(name, folder, f"manifest.json lists a {split} shard it cannot read ({s!r})")
        at += s["tokens"]
    if at != tokens:
        raise corrupt(name, folder, f"the {split} shards hold {at} tokens, the manifest's {split} split {tokens}")


def is_fingerprint(value) -> bool:
    return isinstance(value, dict) and set(value) == set(FINGERPRINT_PARTS)


def fingerprint_files(folder: Path, has_tokenizer: bool) -> dict:
    """The fingerprint of the corpus files in `folder` (see Corpus.fingerprint). A split hashes its
    token stream's bytes, then its document index as little-endian int64, so the .npy header does
    not count."""
    folder = Path(folder)
    out = {"tokenizer": sha256_file(folder / "tokenizer.json") if has_tokenizer else None}
    for split in SPLITS:
        h = hashlib.sha256()
        with open(tokens_file(folder, split), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0idx\0")
        h.update(np.ascontiguousarray(np.load(index_file(folder, split)), dtype="<i8").tobytes())
        out[split] = h.hexdigest()
    return out


def fingerprint_changes(recorded: dict, current: dict) -> list[str]:
    """What differs between two fingerprints, in words: "tokenizer", "train split", ..."""
    return [part if part == "tokenizer" else f"{part} split" for part in FINGERPRINT_PARTS
            if recorded.get(part) != current.get(part)]
