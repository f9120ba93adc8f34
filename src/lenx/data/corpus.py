"""Prepare corpora on disk and open them.

Layout of `<root>/<name>/`:
  manifest.json             what was built, from what, and how big (written last)
  tokenizer.json            HF tokenizer (absent for `synthetic`)
  {train,val,test}.bin      uint16 token stream; each document's tokens then one EOS
  {train,val,test}.idx.npy  int64 [n_docs, 2]: start offset, length (without the EOS)

A folder without a valid manifest.json counts as not prepared. A corpus is built in a
hidden sibling folder `.<name>.build-<pid>` and swapped in only when complete, so a
failed prepare leaves the previous corpus as it was.
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
from ..fileio import write_json
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


# --- opening -------------------------------------------------------------------------

class Corpus:
    """A prepared corpus: token streams, document index and tokenizer."""

    def __init__(self, name: str, root: Path, manifest: dict):
        self.name, self.root, self.manifest = name, Path(root), manifest
        tok = manifest["tokenizer"]
        self.vocab_size: int = int(tok["vocab_size"])
        self.eos_id: int = int(tok["eos_id"])
        self._tok = None

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


def _check_enough_docs(name: str, n_docs: int, val_frac: float, test_frac: float) -> None:
    """Splitting by document needs one document for train and for each requested split."""
    splits = ["train"] + [s for s, frac in (("val", val_frac), ("test", test_frac)) if frac > 0]
    if n_docs < len(splits):
        which = splits[0] if len(splits) == 1 else ", ".join(splits[:-1]) + " and " + splits[-1]
        raise DataError(f"corpus {name!r} has {n_docs} document{'' if n_docs == 1 else 's'} after cleaning, "
                        f"but splitting by document needs at least {len(splits)} (one each for {which}); "
                        "add documents")


def _write_split(folder: Path, split: str, docs: Iterator[np.ndarray], eos_id: int) -> dict:
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
    for n in LONG:
        stats[f"docs_ge_{n}_tokens"] = int((lens >= n).sum())
    return stats


def _read_user_data(path: Path) -> tuple[list, dict]:
    """Documents from a folder of text files (recursive) or a JSONL file with a "text" field."""
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
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)["text"]
                except (ValueError, KeyError, TypeError) as e:
                    msg = f"{path} line {i + 1} is not JSON with a \"text\" field ({e}); fix or remove it"
                    raise DataError(msg) from e
                docs.append((f"{path.name}:{i + 1}", str(text)))
        record = {"name": "user", "path": str(path.resolve()), "lines": len(docs)}
    else:
        raise DataError(f"--from path {path} is neither a folder nor a .jsonl file; "
                        "give a folder of text files or a JSONL file")
    return docs, record


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


def _params(from_path, tokenizer, vocab_size, seed, val_frac, test_frac) -> dict:
    return {"from_path": str(Path(from_path).resolve()) if from_path else None, "tokenizer": tokenizer,
            "vocab_size": vocab_size, "seed": seed, "val_frac": val_frac, "test_frac": test_frac}


def _check_args(name, from_path, tokenizer, vocab_size, val_frac, test_frac, root) -> None:
    _check_name(name)
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


def _build_text(folder: Path, name: str, from_path, tokenizer: str, vocab_size: int, seed: int,
                val_frac: float, test_frac: float, reg: Registries, progress: bool, allow_missing: bool) -> dict:
    # 1. Documents: read, normalise, dedupe.
    if from_path is not None:
        raw, record = _read_user_data(Path(from_path))
        records, missing = [record], []
    else:
        raw, records, missing = _gather_builtin(name, BUILTIN_SOURCES[name](), reg, progress, allow_missing)
    docs, cleaning = clean_docs(raw)
    del raw
    if not docs:
        raise DataError(f"no usable documents for {name!r} (all empty or duplicates); check the input")
    _check_enough_docs(name, len(docs), val_frac, test_frac)
    if from_path is not None:
        records[0].update(docs=len(docs), chars=sum(len(t) for _, t in docs))

    # 2. Split by document; within a split, a seeded random order mixes the stream.
    lengths = np.array([len(t) for _, t in docs])
    assign = split_docs(lengths, seed, val_frac, test_frac)
    rng = np.random.default_rng(seed + 1)
    members = {s: rng.permutation(np.flatnonzero(assign == i)) for i, s in enumerate(SPLITS)}

    # 3. Tokenizer: trained on the train split only (or GPT-2's).
    log.info("preparing the %s tokenizer", tokenizer)
    tok_record = {"kind": tokenizer}
    if tokenizer == "gpt2":
        tok, fetched = gpt2_tokenizer(reg)
        tok_record["source"] = fetched.record()
    else:
        train_texts = (docs[i][1] for i in members["train"])
        tok = train_bpe(train_texts, vocab_size, n_texts=len(members["train"]), progress=progress)
    eos_id = tok.token_to_id(EOS_TOKEN)
    tok_record.update(vocab_size=tok.get_vocab_size(), eos_id=eos_id, eos_token=EOS_TOKEN, file="tokenizer.json")
    tok.save(str(folder / "tokenizer.json"))

    # 4. Encode and pack every split.
    splits = {}
    with tqdm(total=int(lengths.sum()), desc="encoding", unit="char", unit_scale=True, disable=not progress) as bar:
        for split in SPLITS:
            texts = [docs[i][1] for i in members[split]]

            def counted(ids_iter, texts=texts):
                for text, ids in zip(texts, ids_iter, strict=True):
                    bar.update(len(text))
                    yield ids

            splits[split] = _write_split(folder, split, counted(encode_docs(tok, texts)), eos_id)
            splits[split]["chars"] = int(sum(len(t) for t in texts))
    return {"sources": records, "missing_sources": missing, "cleaning": cleaning, "tokenizer": tok_record,
            "splits": splits}


def _is_prepared(name: str, folder: Path, m: dict, params: dict, allow_missing: bool) -> bool:
    """Whether the corpus on disk is complete and was built with these settings."""
    if m.get("params") != params or (_missing_sources(name, m) and not allow_missing):
        return False
    try:
        _check_files(name, folder, m)
    except DataError:
        return False  # broken: rebuild
    return True


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
                   progress: bool = True, force: bool = False, allow_missing_sources: bool = False) -> dict:
    """Build `<root>/<name>/` and return its manifest.

    Built-in names are in CORPORA; any other name needs `from_path` (a folder of text
    files, or a JSONL file with a "text" field). Downloads are cached in `cache_dir`
    (default `<root>/.cache`). If the corpus is already prepared with the same
    settings it is returned as is, unless `force`.

    A built-in corpus needs every one of its sources: if one cannot be fetched this
    raises, unless `allow_missing_sources`, which builds from the rest and lists the
    missing ones in the manifest under "missing_sources". Such a partial corpus counts
    as prepared only for a later call that allows missing sources too.

    On any failure the corpus that was there before is left untouched.
    """
    t0 = time.time()
    root = Path(root)
    _check_args(name, from_path, tokenizer, vocab_size, val_frac, test_frac, root)
    params = _params(from_path, tokenizer, vocab_size, seed, val_frac, test_frac)
    if name == "synthetic":
        params.update(tokenizer="none", vocab_size=synthetic.VOCAB)
    folder = root / name
    old = _read_manifest(folder)
    if old is not None and not force and _is_prepared(name, folder, old, params, allow_missing_sources):
        log.info("corpus %s is already prepared at %s", name, folder)
        return old

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
            reg = Registries(Path(cache_dir) if cache_dir else root / ".cache")
            manifest.update(_build_text(build, name, from_path, tokenizer, vocab_size, seed,
                                        val_frac, test_frac, reg, progress, allow_missing_sources))
        for n in LONG:
            manifest[f"test_docs_ge_{n}_tokens"] = manifest["splits"]["test"][f"docs_ge_{n}_tokens"]
        manifest["seconds"] = round(time.time() - t0, 1)
        write_json(build / "manifest.json", manifest)
        _swap_in(build, real)
    finally:
        shutil.rmtree(build, ignore_errors=True)  # gone already after a successful swap
    log.info("prepared %s: %s", name, {s: manifest["splits"][s]["tokens"] for s in SPLITS})
    return manifest
