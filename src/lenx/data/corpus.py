"""Prepare corpora on disk and open them.

Layout of `<root>/<name>/`:
  manifest.json             what was built, from what, and how big (written last)
  tokenizer.json            HF tokenizer (absent for `synthetic`)
  {train,val,test}.bin      uint16 token stream; each document's tokens then one EOS
  {train,val,test}.idx.npy  int64 [n_docs, 2]: start offset, length (without the EOS)

A folder without a valid manifest.json counts as not prepared. A corpus is built in a
hidden sibling folder `.<name>.build-<pid>` and swapped in only when complete, so a
failed prepare leaves the previous corpus as it was. Replacing a corpus prepared with
other settings needs force=True (`lenx prepare --force`).

manifest["fingerprint"] pins the corpus's content: the SHA-256 of tokenizer.json and of
each split (its token stream and document index). A run records it (meta.json), and
evaluating or generating with the run refuses a corpus whose fingerprint differs
(lenx.runtime.open_run_corpus). Corpora prepared before fingerprints existed get theirs
computed from their files when asked (Corpus.fingerprint).

`long_test=N` reserves N documents of at least `long_test_tokens` tokens for the test
split (so evaluation windows at long lengths can each come from their own document);
the rest is split as usual. The default, 0, builds exactly the split it always did.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from . import synthetic
from ..fileio import sha256_file, write_json
from .errors import DataError
from .fetch import Registries
from .sources import BUILTIN_SOURCES, Source
from .tokenizer import (
    EOS_TOKEN,
    MAX_VOCAB,
    encode_docs,
    gpt2_tokenizer,
    load_tokenizer,
    train_bpe,
)

log = logging.getLogger("lenx.data")

CORPORA = ("tech", "books", "synthetic")
SPLITS = ("train", "val", "test")
TOKENIZERS = ("bpe", "gpt2")
FORMAT = "lenx-corpus-v1"
LONG = (8192, 16384)  # test documents at least this many tokens are counted in the manifest
LONG_TEST_TOKENS = 16384  # the default size of a document that `long_test` reserves for test


# --- opening -------------------------------------------------------------------------

class Corpus:
    """A prepared corpus: token streams, document index and tokenizer."""

    def __init__(self, name: str, root: Path, manifest: dict):
        self.name, self.root, self.manifest = name, Path(root), manifest
        tok = manifest["tokenizer"]
        self.vocab_size: int = int(tok["vocab_size"])
        self.eos_id: int = int(tok["eos_id"])
        self._tok = None
        self._fingerprint: dict | None = None

    def __repr__(self) -> str:
        toks = {s: self.manifest["splits"][s]["tokens"] for s in SPLITS}
        return f"Corpus({self.name!r}, vocab_size={self.vocab_size}, tokens={toks})"

    def _split(self, split: str) -> str:
        if split not in SPLITS:
            raise DataError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
        return split

    def tokens(self, split: str) -> np.ndarray:
        """The split's whole token stream (uint16, memory-mapped, read-only)."""
        path = self.root / f"{self._split(split)}.bin"
        if self.manifest["splits"][split]["tokens"] == 0:
            return np.zeros(0, dtype=np.uint16)  # numpy cannot map an empty file
        return np.memmap(path, dtype=np.uint16, mode="r")

    def docs(self, split: str) -> np.ndarray:
        """int64 [n_docs, 2]: each document's start offset in tokens(split) and its length.

        The EOS after a document sits at start + length.
        """
        path = self.root / f"{self._split(split)}.idx.npy"
        try:
            idx = np.load(path)
        except (OSError, ValueError) as e:
            raise _corrupt(self.name, self.root, f"{path.name} is unreadable ({e})") from e
        n = self.manifest["splits"][split]["docs"]
        if idx.shape != (n, 2) or idx.dtype != np.int64:
            raise _corrupt(self.name, self.root, f"{path.name} has shape {idx.shape}, manifest says ({n}, 2)")
        return idx

    def fingerprint(self) -> dict:
        """{"tokenizer": SHA-256 of tokenizer.json (None without one), "train" / "val" / "test": SHA-256 of
        the split's tokens and document index}: the manifest's, or, for a corpus prepared before
        manifests recorded one, computed from the files (once per Corpus)."""
        if self._fingerprint is None:
            recorded = self.manifest.get("fingerprint")
            self._fingerprint = dict(recorded) if _is_fingerprint(recorded) else fingerprint_files(
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
                raise _corrupt(self.name, self.root, f"tokenizer.json is unreadable ({e})") from e
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


FINGERPRINT_PARTS = ("tokenizer",) + SPLITS


def _is_fingerprint(value) -> bool:
    return isinstance(value, dict) and set(value) == set(FINGERPRINT_PARTS)


def fingerprint_files(folder: Path, has_tokenizer: bool) -> dict:
    """The fingerprint of the corpus files in `folder` (see Corpus.fingerprint). A split hashes its
    token stream's bytes, then its document index as little-endian int64, so the .npy header does
    not count."""
    folder = Path(folder)
    out = {"tokenizer": sha256_file(folder / "tokenizer.json") if has_tokenizer else None}
    for split in SPLITS:
        h = hashlib.sha256()
        with open(folder / f"{split}.bin", "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0idx\0")
        h.update(np.ascontiguousarray(np.load(folder / f"{split}.idx.npy"), dtype="<i8").tobytes())
        out[split] = h.hexdigest()
    return out


def fingerprint_changes(recorded: dict, current: dict) -> list[str]:
    """What differs between two fingerprints, in words: "tokenizer", "train split", ..."""
    return [part if part == "tokenizer" else f"{part} split" for part in FINGERPRINT_PARTS
            if recorded.get(part) != current.get(part)]


def _corrupt(name: str, folder: Path, what: str) -> DataError:
    return DataError(f"corpus {name!r} at {folder} is corrupt: {what}; "
                     f"delete that folder and run `lenx prepare {name}` again")


def _read_manifest(folder: Path) -> dict | None:
    """The manifest, or None when the folder is missing or holds no valid one."""
    try:
        m = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or m.get("format") != FORMAT or not all(s in m.get("splits", {}) for s in SPLITS):
        return None
    return m


def _check_files(name: str, folder: Path, m: dict) -> None:
    """Cheap consistency checks: every file there, .bin sizes as the manifest says."""
    for split in SPLITS:
        for fname in (f"{split}.bin", f"{split}.idx.npy"):
            if not (folder / fname).is_file():
                raise _corrupt(name, folder, f"{fname} is missing")
        want = 2 * m["splits"][split]["tokens"]
        have = (folder / f"{split}.bin").stat().st_size
        if have != want:
            raise _corrupt(name, folder, f"{split}.bin has {have} bytes, manifest says {want}")
    if m["tokenizer"]["kind"] != "none" and not (folder / "tokenizer.json").is_file():
        raise _corrupt(name, folder, "tokenizer.json is missing")


def _prepared_names(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if not p.name.startswith(".") and p.is_dir() and (p / "manifest.json").is_file())


def _unknown(name: str, root: Path) -> DataError:
    known = sorted(set(CORPORA) | set(_prepared_names(root)))
    near = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return DataError(
        f"unknown corpus {name!r}; {hint}built-in corpora: {', '.join(CORPORA)}"
        f" (or prepare your own with `lenx prepare {name} --from PATH`)"
    )


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name or ""):
        raise DataError(f"bad corpus name {name!r}; use letters, digits, '_', '-' or '.'")


def open_corpus(name: str, root: Path = Path("data")) -> Corpus:
    """Open a prepared corpus; a one-line DataError says what to do otherwise."""
    _check_name(name)
    root = Path(root)
    folder = root / name
    m = _read_manifest(folder)
    if m is None:
        if name not in CORPORA and not folder.is_dir():
            raise _unknown(name, root)
        how = f"lenx prepare {name}" + ("" if name in CORPORA else " --from PATH")
        raise DataError(f"corpus {name!r} is not prepared yet (no valid {folder}/manifest.json); run `{how}`")
    _check_files(name, folder, m)
    return Corpus(name, folder, m)


# --- preparing -----------------------------------------------------------------------

def _decode(data: str | bytes) -> tuple[str, bool]:
    """(text, whether it was valid UTF-8); invalid bytes become U+FFFD."""
    if isinstance(data, str):
        return data, True
    try:
        return data.decode("utf-8"), True
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace"), False


def normalise(data: str | bytes) -> str:
    """UTF-8 text with Unix newlines and no byte-order mark."""
    text = _decode(data)[0]
    return text.replace("\r\n", "\n").replace("\r", "\n").removeprefix("\ufeff")


def clean_docs(docs: Iterable[tuple[str, str | bytes]]) -> tuple[list[tuple[str, str]], dict]:
    """Normalise, drop empty documents and exact duplicates (first one wins)."""
    out, seen = [], set()
    stats = {"docs_read": 0, "empty_dropped": 0, "duplicates_dropped": 0, "not_utf8_kept_with_replacements": 0}
    for doc_id, data in docs:
        stats["docs_read"] += 1
        text, valid = _decode(data)
        text = normalise(text)
        if not text.strip():
            stats["empty_dropped"] += 1
            continue
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        if digest in seen:
            stats["duplicates_dropped"] += 1
            continue
        seen.add(digest)
        stats["not_utf8_kept_with_replacements"] += not valid
        out.append((doc_id, text))
    stats["docs_kept"] = len(out)
    return out, stats


def split_docs(lengths: np.ndarray, seed: int, val_frac: float, test_frac: float) -> np.ndarray:
    """Assign each document to 0=train, 1=val, 2=test; whole documents only.

    Stratified by length so val and test get their fair share of long documents:
    docs are sorted longest first (shuffled within blocks of 20 neighbours), then
    dealt out with running quotas, so every stretch of the length ranking
    contributes about val_frac/test_frac of its docs.
    """
    rng = np.random.default_rng(seed)
    n = len(lengths)
    order = np.lexsort((rng.random(n), -np.asarray(lengths)))
    for i in range(0, n, 20):
        rng.shuffle(order[i : i + 20])
    split = np.zeros(n, dtype=np.int8)
    phase = rng.random(2)  # where in each quota period the pick lands
    counts = [0, 0]
    for rank, doc in enumerate(order):
        for s, frac in ((1, val_frac), (2, test_frac)):
            if counts[s - 1] < np.floor((rank + 1) * frac + phase[s - 1]):
                split[doc] = s
                counts[s - 1] += 1
                break
    # Tiny corpora: train and each requested split still get one document, taken from the
    # biggest split, if there are enough documents.
    wanted = [0] + [s for s, frac in ((1, val_frac), (2, test_frac)) if frac > 0]
    for s in wanted:
        sizes = np.bincount(split, minlength=3)
        donor = int(np.argmax(sizes))
        if sizes[s] == 0 and sizes[donor] > 1:
            split[rng.choice(np.flatnonzero(split == donor))] = s
    return split


def split_docs_reserving(lengths: np.ndarray, reserved: np.ndarray, seed: int, val_frac: float,
                         test_frac: float) -> np.ndarray:
    """split_docs of the documents not in `reserved`; the reserved ones all go to test (2).

    With nothing reserved this is split_docs itself, so the split is the one it always was.
    """
    if len(reserved) == 0:
        return split_docs(lengths, seed, val_frac, test_frac)
    lengths = np.asarray(lengths)
    rest = np.setdiff1d(np.arange(len(lengths)), reserved)
    split = np.full(len(lengths), 2, dtype=np.int8)
    split[rest] = split_docs(lengths[rest], seed, val_frac, test_frac)
    return split


def reserve_long_docs(name: str, token_counts: np.ndarray, n: int, min_tokens: int, seed: int,
                      counted_with: str) -> np.ndarray:
    """The indices (sorted) of `n` documents of at least `min_tokens` tokens, drawn by `seed`
    from all such documents; a one-line DataError when there are fewer than `n`."""
    candidates = np.flatnonzero(np.asarray(token_counts) >= min_tokens)
    if len(candidates) < n:
        raise _too_few_long(name, n, min_tokens, f"has only {len(candidates)} ({counted_with})")
    rng = np.random.default_rng([seed, 0x6C6F6E67])  # a stream of its own: the other draws stay as they were
    return np.sort(rng.choice(candidates, size=n, replace=False))


def _too_few_long(name: str, n: int, min_tokens: int, have: str) -> DataError:
    return DataError(f"--long-test {n} needs {n} documents of >= {min_tokens} tokens, but corpus {name!r} {have}; "
                     "ask for fewer (--long-test), or a lower --long-test-tokens")


def _check_enough_docs(name: str, n_docs: int, val_frac: float, test_frac: float, long_test: int = 0) -> None:
    """Splitting by document needs one document for train and for each requested split (test
    has its reserved documents when `long_test`), besides the `long_test` reserved ones."""
    splits = ["train"] + [s for s, frac in (("val", val_frac), ("test", test_frac))
                          if frac > 0 and not (s == "test" and long_test)]
    if n_docs < len(splits) + long_test:
        which = splits[0] if len(splits) == 1 else ", ".join(splits[:-1]) + " and " + splits[-1]
        also = f", besides the {long_test} reserved for test by --long-test" if long_test else ""
        raise DataError(f"corpus {name!r} has {n_docs} document{'' if n_docs == 1 else 's'} after cleaning, "
                        f"but splitting by document needs at least {len(splits) + long_test} (one each for "
                        f"{which}{also}); add documents")


def _write_split(folder: Path, split: str, docs: Iterator[np.ndarray], eos_id: int,
                 long: tuple[int, ...] = LONG) -> dict:
    """Write <split>.bin and <split>.idx.npy; return the split's stats."""
    index, pos = [], 0
    eos = np.array([eos_id], dtype=np.uint16)
    with open(folder / f"{split}.bin", "wb") as f:
        for ids in docs:
            index.append((pos, len(ids)))
            f.write(ids.astype(np.uint16, copy=False).tobytes())
            f.write(eos.tobytes())
            pos += len(ids) + 1
    idx = np.array(index, dtype=np.int64).reshape(-1, 2)
    with open(folder / f"{split}.idx.npy", "wb") as f:
        np.save(f, idx)
    lens = idx[:, 1]
    stats = {"docs": len(idx), "tokens": pos, "doc_tokens": int(lens.sum()),
             "max_doc_tokens": int(lens.max()) if len(lens) else 0}
    for n in long:
        stats[f"docs_ge_{n}_tokens"] = int((lens >= n).sum())
    return stats


def _read_user_data(path: Path, skip_bad_records: bool = False) -> tuple[list, dict]:
    """Documents from a folder of text files (recursive) or a JSONL file with a "text" field.

    A JSONL line that is not a JSON object with a string "text" (not JSON, no "text", or a text that
    is null, a number, a list, an object or a boolean) is a one-line DataError naming the file and
    line, unless `skip_bad_records`: then it is left out and counted in the source's record
    ("bad_records_skipped", the first lines in "bad_record_lines")."""
    path = Path(path).expanduser()
    docs, skipped = [], 0
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        for p in files:
            data = p.read_bytes()
            try:  # "any utf-8 decodable file": binary files are skipped, not mangled
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                skipped += 1
                continue
            if "\x00" in text[:8192]:
                skipped += 1
                continue
            docs.append((str(p.relative_to(path)), text))
        record = {"name": "user", "path": str(path.resolve()), "files": len(files), "files_skipped_not_text": skipped}
    elif path.name.endswith((".jsonl", ".jsonl.gz", ".json")):
        import gzip

        opener = gzip.open if path.name.endswith(".gz") else open
        bad = []
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                problem = _bad_record(line)
                if problem is None:
                    docs.append((f"{path.name}:{i + 1}", json.loads(line)["text"]))
                elif skip_bad_records:
                    bad.append(i + 1)
                else:
                    raise DataError(f"{path} line {i + 1}: {problem}; fix or remove that line, or pass "
                                    "--skip-bad-records to leave such lines out")
        record = {"name": "user", "path": str(path.resolve()), "lines": len(docs), "bad_records_skipped": len(bad)}
        if bad:
            record["bad_record_lines"] = bad[:20]  # the first ones
    else:
        raise DataError(f"--from path {path} is neither a folder nor a .jsonl file; "
                        "give a folder of text files or a JSONL file")
    return docs, record


def _bad_record(line: str) -> str | None:
    """Why a JSONL line is not a document (a JSON object with a string "text"), or None."""
    try:
        record = json.loads(line)
    except ValueError as e:
        return f"is not JSON ({e})"
    if not isinstance(record, dict):
        return f"is {_json_type(record)}, not a JSON object with a \"text\" field"
    if "text" not in record:
        return "has no \"text\" field"
    text = record["text"]
    if not isinstance(text, str):
        if text is None:
            return "\"text\" is null, not a string"
        shown = json.dumps(text, ensure_ascii=False)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        return f"\"text\" is {_json_type(text)} ({shown}), not a string"
    return None


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return "a string"


def _gather_builtin(name: str, sources: list[Source], reg: Registries, progress: bool,
                    allow_missing: bool) -> tuple[list, list, list]:
    """Fetch and read every source (two at a time: decompression releases the GIL).

    Any source that fails makes this fail, naming each failed source and why, unless
    `allow_missing`: then they are left out (and listed in the manifest), as long as
    one source is left.
    """
    docs, records, missing = [], [], []

    def run(src: Source):
        t = time.time()
        files, src_docs = src.get(reg)
        return files, src_docs, time.time() - t

    with ThreadPoolExecutor(max_workers=2) as pool, \
            tqdm(total=len(sources), desc="sources", unit="pkg", disable=not progress) as bar:
        futures = [pool.submit(run, s) for s in sources]
        results = []
        for src, fut in zip(sources, futures, strict=True):
            try:
                results.append((src, *fut.result()))
            except DataError as e:
                missing.append({"source": src.name, "reason": str(e)})
                results.append(None)
            bar.update(1)
            bar.set_postfix_str(src.name)
    for res in results:
        if res is None:
            continue
        src, files, src_docs, secs = res
        chars = sum(len(normalise(d)) for _, d in src_docs)
        records.append({"name": src.name, "files": [f.record() for f in files],
                        "docs": len(src_docs), "chars": chars, "seconds": round(secs, 1)})
        docs.extend(src_docs)
    if missing and (not allow_missing or not records):
        hint = ("fix that and run again" if not records else
                "fix that and run again, or pass --allow-missing-sources to build without them")
        reasons = " | ".join(f"{m['source']}: {m['reason']}" for m in missing)
        raise DataError(f"corpus {name!r} is incomplete, {len(missing)} of {len(sources)} sources failed; "
                        f"{hint} | {reasons}")
    for m in missing:
        log.warning("building %s without source %s: %s", name, m["source"], m["reason"])
    return docs, records, missing


def _missing_sources(name: str, m: dict) -> list[str]:
    """The built-in sources of corpus `name` that manifest `m` does not record."""
    if name not in BUILTIN_SOURCES:
        return []
    have = {s.get("name") for s in m.get("sources", [])}
    return [s.name for s in BUILTIN_SOURCES[name]() if s.name not in have]


def _params(from_path, tokenizer, vocab_size, seed, val_frac, test_frac, long_test=0,
            long_test_tokens=LONG_TEST_TOKENS) -> dict:
    params = {"from_path": str(Path(from_path).resolve()) if from_path else None, "tokenizer": tokenizer,
              "vocab_size": vocab_size, "seed": seed, "val_frac": val_frac, "test_frac": test_frac}
    if long_test:  # only when asked for: a corpus prepared before the option still counts as prepared
        params.update(long_test=int(long_test), long_test_tokens=int(long_test_tokens))
    return params


def _check_long_test(name: str, long_test, long_test_tokens) -> None:
    for option, value, low in (("--long-test", long_test, 0), ("--long-test-tokens", long_test_tokens, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise DataError(f"{option} must be an integer >= {low}, got {value!r}")
    if long_test and name == "synthetic":
        raise DataError("--long-test applies to text corpora; the synthetic corpus generates its long test "
                        "documents itself")


def _check_args(name, from_path, tokenizer, vocab_size, val_frac, test_frac, root, long_test=0,
                long_test_tokens=LONG_TEST_TOKENS, skip_bad_records=False) -> None:
    _check_name(name)
    _check_long_test(name, long_test, long_test_tokens)
    if from_path is None and name not in CORPORA:
        raise _unknown(name, root)
    if from_path is not None and name in CORPORA:
        raise DataError(f"{name!r} is a built-in corpus; give your data another name, "
                        f"e.g. `lenx prepare my{name} --from PATH`")
    if tokenizer not in TOKENIZERS:
        raise DataError(f"unknown tokenizer {tokenizer!r}; use one of {', '.join(TOKENIZERS)}")
    if vocab_size > MAX_VOCAB:
        raise DataError(f"vocab_size {vocab_size} is too big: tokens are stored as uint16, so use at most {MAX_VOCAB}")
    if tokenizer == "bpe" and vocab_size < 258:
        raise DataError(f"vocab_size {vocab_size} is too small: byte-level BPE needs at least 258 "
                        "(256 bytes + EOS + 1)")
    if from_path is not None and not Path(from_path).expanduser().exists():
        raise DataError(f"--from path {from_path} does not exist; give a folder of text files or a .jsonl file")
    if skip_bad_records and (from_path is None or Path(from_path).expanduser().is_dir()):
        raise DataError("--skip-bad-records applies to a JSONL file given with --from (its lines that are not "
                        "a JSON object with a string \"text\")")
    if not (0 <= val_frac < 1 and 0 <= test_frac < 1 and val_frac + test_frac < 1):
        raise DataError(f"val_frac={val_frac} and test_frac={test_frac} must be in [0, 1) and sum to less than 1")


def _build_synthetic(folder: Path, seed: int, val_frac: float, test_frac: float) -> dict:
    docs = synthetic.generate(seed, val_frac, test_frac)
    splits = {}
    for split in SPLITS:
        splits[split] = _write_split(folder, split, iter(docs[split]), synthetic.EOS)
        splits[split]["chars"] = None
    return {"sources": [synthetic.describe()], "missing_sources": [],
            "tokenizer": {"kind": "none", "vocab_size": synthetic.VOCAB, "eos_id": synthetic.EOS, "eos_token": None},
            "splits": splits}


def _read_docs(name: str, from_path, reg: Registries, progress: bool, allow_missing: bool,
               skip_bad_records: bool = False):
    """The corpus's documents, read, normalised and deduplicated: (docs, source records,
    missing sources, cleaning stats)."""
    if from_path is not None:
        raw, record = _read_user_data(Path(from_path), skip_bad_records)
        records, missing = [record], []
    else:
        raw, records, missing = _gather_builtin(name, BUILTIN_SOURCES[name](), reg, progress, allow_missing)
    docs, cleaning = clean_docs(raw)
    del raw
    if not docs:
        raise DataError(f"no usable documents for {name!r} (all empty or duplicates); check the input")
    if from_path is not None:
        records[0].update(docs=len(docs), chars=sum(len(t) for _, t in docs))
    return docs, records, missing, cleaning


def _check_docs(name: str, docs: list, val_frac: float, test_frac: float, long_test: int,
                long_test_tokens: int) -> None:
    """What can be checked before any tokenizing: enough documents for the splits, and, as a
    token is at least one byte (byte-level BPE), enough documents of `long_test_tokens` bytes."""
    _check_enough_docs(name, len(docs), val_frac, test_frac, long_test)
    if long_test:
        big = sum(len(t.encode("utf-8", "surrogatepass")) >= long_test_tokens for _, t in docs)
        if big < long_test:
            raise _too_few_long(name, long_test, long_test_tokens,
                                f"has at most {big} (only {big} of its documents have >= {long_test_tokens} "
                                "bytes, and a token is at least one byte)")


def _members(assign: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """Each split's documents in a seeded random order, which mixes the split's stream."""
    rng = np.random.default_rng(seed + 1)
    return {s: rng.permutation(np.flatnonzero(assign == i)) for i, s in enumerate(SPLITS)}


def _tokenizer(kind: str, docs: list, train: np.ndarray, vocab_size: int, reg: Registries, progress: bool):
    """(tokenizer, its manifest record): BPE trained on the documents `train`, or GPT-2's."""
    log.info("preparing the %s tokenizer", kind)
    record = {"kind": kind}
    if kind == "gpt2":
        tok, fetched = gpt2_tokenizer(reg)
        record["source"] = fetched.record()
    else:
        tok = train_bpe((docs[i][1] for i in train), vocab_size, n_texts=len(train), progress=progress)
    record.update(vocab_size=tok.get_vocab_size(), eos_id=tok.token_to_id(EOS_TOKEN), eos_token=EOS_TOKEN,
                  file="tokenizer.json")
    return tok, record


def _count_tokens(tok, docs: list, progress: bool) -> np.ndarray:
    counts = np.zeros(len(docs), dtype=np.int64)
    with tqdm(total=sum(len(t) for _, t in docs), desc="counting tokens", unit="char", unit_scale=True,
              disable=not progress) as bar:
        for i, ids in enumerate(encode_docs(tok, [t for _, t in docs])):
            counts[i] = len(ids)
            bar.update(len(docs[i][1]))
    return counts


def _build_text(folder: Path, name: str, docs: list, tokenizer: str, vocab_size: int, seed: int,
                val_frac: float, test_frac: float, reg: Registries, progress: bool, long_test: int = 0,
                long_test_tokens: int = LONG_TEST_TOKENS) -> dict:
    # 1. Reserve long documents for test (by tokens). BPE is trained on the train split, which
    # the reservation changes, so tokens are first counted with the BPE of the split without a
    # reservation (GPT-2's tokenizer is fixed: its counts are final), and the final counts are
    # checked after packing.
    lengths = np.array([len(t) for _, t in docs])
    reserved, counter, extra = np.zeros(0, dtype=np.int64), None, {}
    if long_test:
        unreserved = _members(split_docs(lengths, seed, val_frac, test_frac), seed)
        counter = _tokenizer(tokenizer, docs, unreserved["train"], vocab_size, reg, progress)
        counted_with = ("tokens counted with GPT-2's tokenizer" if tokenizer == "gpt2" else
                        "tokens counted with the BPE of the split without --long-test")
        counts = _count_tokens(counter[0], docs, progress)
        reserved = reserve_long_docs(name, counts, long_test, long_test_tokens, seed, counted_with)
        extra = {"reserved_docs": int(long_test), "min_tokens": int(long_test_tokens),
                 "corpus_docs_ge_min_tokens": int((counts >= long_test_tokens).sum()), "counted_with": counted_with}

    # 2. Split by document; within a split, a seeded random order mixes the stream.
    assign = split_docs_reserving(lengths, reserved, seed, val_frac, test_frac)
    members = _members(assign, seed)

    # 3. Tokenizer: trained on the train split only (or GPT-2's).
    if counter is not None and (tokenizer == "gpt2" or np.array_equal(members["train"], unreserved["train"])):
        tok, tok_record = counter
    else:
        tok, tok_record = _tokenizer(tokenizer, docs, members["train"], vocab_size, reg, progress)
    eos_id = tok_record["eos_id"]
    tok.save(str(folder / "tokenizer.json"))

    # 4. Encode and pack every split.
    long = LONG + ((int(long_test_tokens),) if long_test and long_test_tokens not in LONG else ())
    splits = {}
    with tqdm(total=int(lengths.sum()), desc="encoding", unit="char", unit_scale=True, disable=not progress) as bar:
        for split in SPLITS:
            texts = [docs[i][1] for i in members[split]]

            def counted(ids_iter, texts=texts):
                for text, ids in zip(texts, ids_iter, strict=True):
                    bar.update(len(text))
                    yield ids

            splits[split] = _write_split(folder, split, counted(encode_docs(tok, texts)), eos_id, long)
            splits[split]["chars"] = int(sum(len(t) for t in texts))
    out = {"tokenizer": tok_record, "splits": splits}
    if long_test:
        # 5. With the final tokenizer's counts, test must hold long_test documents that long.
        test_lens = np.load(folder / "test.idx.npy")[:, 1]
        reached = int((test_lens[np.isin(members["test"], reserved)] >= long_test_tokens).sum())
        have = int((test_lens >= long_test_tokens).sum())
        if have < long_test:
            raise _too_few_long(name, long_test, long_test_tokens,
                                f"has only {have} in its test split with the tokenizer trained on the final "
                                f"train split ({reached} of the reserved ones reach it there; try another --seed)")
        out["long_test"] = extra | {"reserved_docs_ge_min_tokens": reached}
    return out


def _is_prepared(name: str, folder: Path, m: dict, params: dict, allow_missing: bool) -> bool:
    """Whether the corpus on disk is complete and was built with these settings."""
    if m.get("params") != params or (_missing_sources(name, m) and not allow_missing):
        return False
    try:
        _check_files(name, folder, m)
    except DataError:
        return False  # broken: rebuild
    return True


CORPUS_FILES = re.compile(r"manifest\.json|tokenizer\.json|(train|val|test)\.(bin|idx\.npy)|\..*\.tmp-\d+")


def _check_replace(name: str, folder: Path, old: dict | None, params: dict, allow_missing: bool) -> None:
    """Whether preparing `name` without force may build over what `folder` holds: nothing, or a
    corpus with these very settings whose files are damaged (a repair). A corpus prepared with
    other settings, or a partial built-in one that would be completed, is replaced only with
    force; a folder holding other files than a corpus's is never replaced (its files would go)."""
    if old is None:
        if folder.is_dir() and any(not CORPUS_FILES.fullmatch(p.name) for p in folder.iterdir()):
            raise DataError(f"{folder} exists and is not a lenx corpus (it holds other files); lenx does not replace "
                            f"it: choose another corpus name or --root")
        return
    created = old.get("created", "at an unknown time")
    had = old.get("params") if isinstance(old.get("params"), dict) else {}
    changed = [f"{key} {had.get(key)!r}, now {params.get(key)!r}" for key in sorted(set(had) | set(params))
               if had.get(key) != params.get(key)]
    if changed:
        raise DataError(f"corpus {name!r} already exists at {folder} (prepared {created} with other settings: "
                        f"{'; '.join(changed)}); pass --force to replace it (runs trained on it will then refuse to "
                        "evaluate or generate with the new one), or choose another name")
    missing = _missing_sources(name, old)
    if missing and not allow_missing:
        raise DataError(f"corpus {name!r} at {folder} was built without the sources {', '.join(missing)} "
                        "(--allow-missing-sources); building it whole replaces it: pass --force (runs trained on it "
                        "will then refuse the new one), or --allow-missing-sources to keep it as it is")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process
    return True


def _clean_dead_builds(folder: Path) -> None:
    """Tidy the hidden siblings that a killed prepare of `folder` left behind: drop its
    build folder, and put the old corpus back if it died in the middle of the swap."""
    pattern = re.compile(rf"\.{re.escape(folder.name)}\.(build|old)-(\d+)")
    for p in folder.parent.glob(f".{folder.name}.*-*"):
        m = pattern.fullmatch(p.name)
        if not m or _pid_alive(int(m.group(2))):
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


def prepare_corpus(name: str, root: Path = Path("data"), *, from_path: Path | None = None,
                   tokenizer: str = "bpe", vocab_size: int = 16384, seed: int = 0,
                   val_frac: float = 0.02, test_frac: float = 0.05, cache_dir: Path | None = None,
                   progress: bool = True, force: bool = False, allow_missing_sources: bool = False,
                   long_test: int = 0, long_test_tokens: int = LONG_TEST_TOKENS,
                   skip_bad_records: bool = False) -> dict:
    """Build `<root>/<name>/` and return its manifest.

    Built-in names are in CORPORA; any other name needs `from_path` (a folder of text
    files, or a JSONL file with a "text" field). Downloads are cached in `cache_dir`
    (default `<root>/.cache`). If the corpus is already prepared with the same
    settings it is returned as is, unless `force`; a corpus of that name prepared with other
    settings is replaced only with `force` (a DataError otherwise, before any work), and a
    folder that is not a corpus never.

    A built-in corpus needs every one of its sources: if one cannot be fetched this
    raises, unless `allow_missing_sources`, which builds from the rest and lists the
    missing ones in the manifest under "missing_sources". Such a partial corpus counts
    as prepared only for a later call that allows missing sources too.

    `long_test=N` (text corpora) puts N documents of at least `long_test_tokens` tokens,
    drawn by `seed`, into the test split before the rest is split as usual (so test gets
    them and its `test_frac` share of the rest); too few such documents is a DataError,
    raised before any tokenizing when the documents' sizes in bytes already tell.
    manifest["long_test"] records the reservation; every split records its number of
    documents of >= 8192 and >= 16384 tokens (and >= `long_test_tokens`).

    `skip_bad_records` (a JSONL `from_path`): leave out the lines that are not a JSON object with a
    string "text" and count them in the manifest's source record, instead of failing on the first.

    The manifest's "fingerprint" pins the content (see Corpus.fingerprint).

    On any failure the corpus that was there before is left untouched.
    """
    t0 = time.time()
    root = Path(root)
    _check_args(name, from_path, tokenizer, vocab_size, val_frac, test_frac, root, long_test, long_test_tokens,
                skip_bad_records)
    params = _params(from_path, tokenizer, vocab_size, seed, val_frac, test_frac, long_test, long_test_tokens)
    if name == "synthetic":
        params.update(tokenizer="none", vocab_size=synthetic.VOCAB)
    folder = root / name
    old = _read_manifest(folder)
    if old is not None and not force and _is_prepared(name, folder, old, params, allow_missing_sources):
        log.info("corpus %s is already prepared at %s", name, folder)
        return old
    if old is None or not force:
        _check_replace(name, folder, old, params, allow_missing_sources)

    if name != "synthetic":  # read and check the documents before any build folder exists
        reg = Registries(Path(cache_dir) if cache_dir else root / ".cache")
        docs, records, missing, cleaning = _read_docs(name, from_path, reg, progress, allow_missing_sources,
                                                      skip_bad_records)
        _check_docs(name, docs, val_frac, test_frac, long_test, long_test_tokens)

    # Build next to the real folder (through a symlink, if `folder` is one), so the
    # final renames stay on one filesystem.
    real = folder.resolve()
    real.parent.mkdir(parents=True, exist_ok=True)
    _clean_dead_builds(real)
    build = real.with_name(f".{real.name}.build-{os.getpid()}")
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir()
    try:
        manifest = {"format": FORMAT, "name": name, "kind": "synthetic" if name == "synthetic" else "text",
                    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "params": params}
        if name == "synthetic":
            manifest.update(_build_synthetic(build, seed, val_frac, test_frac))
        else:
            manifest.update(sources=records, missing_sources=missing, cleaning=cleaning)
            manifest.update(_build_text(build, name, docs, tokenizer, vocab_size, seed, val_frac, test_frac,
                                        reg, progress, long_test, long_test_tokens))
        for n in LONG:
            manifest[f"test_docs_ge_{n}_tokens"] = manifest["splits"]["test"][f"docs_ge_{n}_tokens"]
        manifest["fingerprint"] = fingerprint_files(build, manifest["tokenizer"]["kind"] != "none")
        manifest["seconds"] = round(time.time() - t0, 1)
        write_json(build / "manifest.json", manifest)
        _swap_in(build, real)
    finally:
        shutil.rmtree(build, ignore_errors=True)  # gone already after a successful swap
    log.info("prepared %s: %s", name, {s: manifest["splits"][s]["tokens"] for s in SPLITS})
    return manifest
