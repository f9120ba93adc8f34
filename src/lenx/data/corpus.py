"""Open a prepared corpus: its token streams, document index, tokenizer and fingerprint.

The files and the manifest are described in lenx.data.layout; lenx.data.build prepares them.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import numpy as np

from .errors import DataError
from .layout import (
    SPLITS,
    check_files,
    corrupt,
    fingerprint_files,
    index_file,
    is_fingerprint,
    read_manifest,
    shard_records,
    token_dtype,
    tokens_file,
)
from .shards import ShardedTokens
from .tokenizer import load_tokenizer

CORPORA = ("tech", "books", "code", "synthetic")  # the built-in corpora, which lenx.data.build knows how to build


class Corpus:
    """A prepared corpus: token streams, document index and tokenizer."""

    def __init__(self, name: str, root: Path, manifest: dict):
        self.name, self.root, self.manifest = name, Path(root), manifest
        tok = manifest["tokenizer"]
        self.vocab_size: int = int(tok["vocab_size"])
        self.eos_id: int = int(tok["eos_id"])
        self.token_dtype: np.dtype = token_dtype(manifest)
        self._tok = None
        self._fingerprint: dict | None = None
        self._sharded: dict[str, ShardedTokens] = {}

    def __repr__(self) -> str:
        toks = {s: self.manifest["splits"][s]["tokens"] for s in SPLITS}
        return f"Corpus({self.name!r}, vocab_size={self.vocab_size}, tokens={toks})"

    def _split(self, split: str) -> str:
        if split not in SPLITS:
            raise DataError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        return split

    def tokens(self, split: str) -> np.ndarray | ShardedTokens:
        """The split's whole token stream (uint16, or uint32 for a vocabulary over 65536 ids;
        memory-mapped, read-only). A sharded split (`lenx shard`) is a ShardedTokens view: len,
        dtype and slicing [a:b] as an array, each shard mapped when first read."""
        path = tokens_file(self.root, self._split(split))
        shards = shard_records(self.manifest, split)
        if shards is not None:
            if split not in self._sharded:
                self._sharded[split] = ShardedTokens(self.name, self.root, split, self.token_dtype, shards)
            return self._sharded[split]
        if self.manifest["splits"][split]["tokens"] == 0:
            return np.zeros(0, dtype=self.token_dtype)  # numpy cannot map an empty file
        return np.memmap(path, dtype=self.token_dtype, mode="r")

    def docs(self, split: str) -> np.ndarray:
        """int64 [n_docs, 2]: each document's start offset in tokens(split) and its length.

        The EOS after a document sits at start + length.
        """
        path = index_file(self.root, self._split(split))
        try:
            idx = np.load(path)
        except (OSError, ValueError) as e:
            raise corrupt(self.name, self.root, f"{path.name} is unreadable ({e})") from e
        n = self.manifest["splits"][split]["docs"]
        if idx.shape != (n, 2) or idx.dtype != np.int64:
            raise corrupt(self.name, self.root, f"{path.name} has shape {idx.shape}, manifest says ({n}, 2)")
        return idx

    def fingerprint(self) -> dict:
        """{"tokenizer": SHA-256 of tokenizer.json (None without one), "train" / "val" / "test": SHA-256 of
        the split's tokens and document index}: the manifest's, or, for a corpus prepared before
        manifests recorded one, computed from the files (once per Corpus)."""
        if self._fingerprint is None:
            recorded = self.manifest.get("fingerprint")
            self._fingerprint = dict(recorded) if is_fingerprint(recorded) else fingerprint_files(
                self.root, self.manifest["tokenizer"]["kind"] != "none")
        return dict(self._fingerprint)

    def tokenizer(self):
        """The HF `tokenizers.Tokenizer`, or None for the token-level synthetic corpus."""
        if self.manifest["tokenizer"]["kind"] == "none":
            return None
        if self._tok is None:
            path = self.root / "tokenizer.json"
            try:
                self._tok = load_tokenizer(path)
            except Exception as e:  # tokenizers raises its own exception types
                raise corrupt(self.name, self.root, f"tokenizer.json is unreadable ({e})") from e
        return self._tok

    def encode(self, text: str) -> list[int]:
        tok = self.tokenizer()
        if tok is None:
            raise DataError(f"corpus {self.name!r} is token-level and has no text tokenizer; "
                            "use its token ids directly")
        return tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """Text of `ids`; EOS shows as <|endoftext|>. Synthetic ids show as numbers."""
        ids = [int(i) for i in ids]
        tok = self.tokenizer()
        if tok is None:
            return " ".join("<eos>" if i == self.eos_id else str(i) for i in ids)
        return tok.decode(ids, skip_special_tokens=False)


def _prepared_names(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if not p.name.startswith(".") and p.is_dir() and (p / "manifest.json").is_file())


def unknown_corpus(name: str, root: Path) -> DataError:
    """The error for a name that is neither built in nor prepared under `root`: the nearest one."""
    known = sorted(set(CORPORA) | set(_prepared_names(root)))
    near = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return DataError(
        f"unknown corpus {name!r}; {hint}built-in corpora: {', '.join(CORPORA)}"
        f" (or prepare your own with `lenx prepare {name} --from PATH`)"
    )


def check_name(name: str) -> None:
    """A corpus name is a plain folder name."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name or ""):
        raise DataError(f"bad corpus name {name!r}; use letters, digits, '_', '-' or '.'")


def open_corpus(name: str, root: Path = Path("data")) -> Corpus:
    """Open a prepared corpus; a one-line DataError says what to do otherwise."""
    check_name(name)
    root = Path(root)
    folder = root / name
    m = read_manifest(folder)
    if m is None:
        if name not in CORPORA and not folder.is_dir():
            raise unknown_corpus(name, root)
        how = f"lenx prepare {name}" + ("" if name in CORPORA else " --from PATH")
        raise DataError(f"corpus {name!r} is not prepared yet (no valid {folder}/manifest.json); run `{how}`")
    check_files(name, folder, m)
    return Corpus(name, folder, m)
