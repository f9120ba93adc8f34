"""`lenx shard`: a prepared corpus's train stream cut into shard files and back (lenx.data.layout).

Sharding writes the shards into a hidden folder beside the corpus files, moves it into place as
`train.shards/`, and only then writes the manifest that lists them (atomically): a command killed at
any point leaves the corpus as it was, reading train.bin, and the next `lenx shard` of that corpus
removes what the killed one left. The content is the same stream, so the manifest's fingerprint is
unchanged (checked while the shards are written). Joining writes train.bin back the same way.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
import re
import shutil
import sys

import numpy as np

from ..fileio import TMP_MARK, pid_alive, write_json
from .corpus import Corpus, open_corpus
from .errors import DataError
from .layout import index_file, shard_records, shards_dir, tokens_file

DEFAULT_SIZE = "30M"
# At most this many shards: a run that samples the train split at random maps every shard, and each
# map holds an open file (a process may commonly open 1,024); the manifest lists every one (a tiny
# --size once wrote 1.6M files and a 291 MB manifest). At the default size that is 30G tokens.
MAX_SHARDS = 1000
CHUNK = 1 << 23  # tokens copied at a time


def parse_size(text: str, itemsize: int) -> int:
    """Tokens per shard from "30M" / "30000000" (tokens; K, M, G are powers of 1000) or "40MiB" /
    "60MB" (bytes of the shard file; KiB, MiB, GiB or KB, MB, GB)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(i?B)?\s*", text or "", re.I)
    if not m:
        raise DataError(f"--size must be tokens (30M, 5000000) or bytes (40MiB, 60MB), got {text!r}")
    number, prefix, unit = float(m.group(1)), m.group(2).upper(), (m.group(3) or "")
    base = 1024 if unit.lower() == "ib" else 1000
    value = number * base ** " KMG".index(prefix or " ")
    tokens = int(value // itemsize) if unit else int(value)
    if tokens < 1:
        raise DataError(f"--size {text!r} holds no token (a token takes {itemsize} bytes)")
    return tokens



def _tidy(corpus: Corpus) -> None:
    """Remove what a killed `lenx shard` left: its hidden folders and files (a running one's is an
    error), and a train.shards/ the manifest does not list."""
    pattern = re.compile(rf"\.train\.(shards|bin){re.escape(TMP_MARK)}(\d+)")
    for path in sorted(corpus.root.iterdir()):
        m = pattern.fullmatch(path.name)
        if not m:
            continue
        if pid_alive(int(m.group(2))) and int(m.group(2)) != os.getpid():
            raise DataError(f"another `lenx shard` (process {m.group(2)}) is writing {path}; wait for it to end")
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    stray = shards_dir(corpus.root, "train")
    if stray.is_dir() and shard_records(corpus.manifest, "train") is None:
        shutil.rmtree(stray)
        print(f"note: removed {stray}: a `lenx shard` or `--join` that did not finish left it, and the manifest does "
              "not list it", file=sys.stderr)


def _fingerprint_tail(h, corpus: Corpus) -> str:
    """The train split's fingerprint (lenx.data.layout.fingerprint_files) from a hash of its stream."""
    h.update(b"\0idx\0")
    h.update(np.ascontiguousarray(np.load(index_file(corpus.root, "train")), dtype="<i8").tobytes())
    return h.hexdigest()


def _copy(src, a: int, b: int, out, hashes) -> None:
    for at in range(a, b, CHUNK):
        data = np.ascontiguousarray(src[at:min(b, at + CHUNK)]).tobytes()
        out.write(data)
        for h in hashes:
            h.update(data)


def shard_corpus(name: str, root: Path, size: str = DEFAULT_SIZE, remove_bin: bool = False) -> dict:
    """Cut corpus `name`'s train stream into shards of `size` (parse_size) and record them in its
    manifest; `remove_bin` then deletes train.bin. A corpus sharded at this size already is left as
    it is (remove_bin still applies, once every shard is checked). Returns the manifest's shard entry."""
    corpus = open_corpus(name, root)
    tokens = parse_size(size, corpus.token_dtype.itemsize)
    entry = corpus.manifest["shards"]["train"] if shard_records(corpus.manifest, "train") is not None else None
    if entry is not None:
        if entry.get("tokens_per_shard") != tokens:
            raise DataError(f"corpus {name!r} is sharded already, in {len(entry['files'])} shards of "
                            f"{entry.get('tokens_per_shard'):,} tokens; to cut it at another size, join it first: "
                            f"lenx shard {name} --join")
        if remove_bin and tokens_file(corpus.root, "train").is_file():
            bad = [f"{s['file']} ({why})" for s, why in check_shards(corpus) if why]
            if bad:
                raise DataError(f"train.bin of corpus {name!r} is kept: its shards are not all here and intact "
                                f"({', '.join(bad)})")
            tokens_file(corpus.root, "train").unlink()
        return entry
    n = corpus.manifest["splits"]["train"]["tokens"]
    if n == 0:
        raise DataError(f"corpus {name!r} has an empty train split: nothing to shard")
    count = -(-n // tokens)
    if count > MAX_SHARDS:
        raise DataError(f"--size {size} would cut the train split of corpus {name!r} ({n:,} tokens) into {count:,} "
                        f"shards; lenx writes at most {MAX_SHARDS:,} (a run that samples at random keeps every shard "
                        f"open, and a process may commonly open 1,024 files): use --size {-(-n // MAX_SHARDS)} or "
                        f"more (the default, {DEFAULT_SIZE}, makes shards a machine takes one call at a time)")
    _tidy(corpus)
    fingerprint = corpus.fingerprint()  # the manifest's, or computed from the files of an older corpus
    src, stream = corpus.tokens("train"), hashlib.sha256()
    build = corpus.root / f".train.shards{TMP_MARK}{os.getpid()}"
    build.mkdir()
    width = max(5, len(str((n - 1) // tokens)))
    records = []
    try:
        for i, start in enumerate(range(0, n, tokens)):
            stop, h = min(n, start + tokens), hashlib.sha256()
            file = f"{i:0{width}d}.bin"
            with open(build / file, "wb") as out:
                _copy(src, start, stop, out, (h, stream))
            records.append({"file": file, "start": start, "tokens": stop - start, "sha256": h.hexdigest()})
        if _fingerprint_tail(stream, corpus) != fingerprint["train"]:
            raise DataError(f"train.bin of corpus {name!r} does not match the manifest's fingerprint: the corpus is "
                            f"damaged; prepare it again (lenx prepare {name} --force)")
        os.rename(build, shards_dir(corpus.root, "train"))
    finally:
        shutil.rmtree(build, ignore_errors=True)
    entry = {"tokens_per_shard": tokens, "files": records}
    write_json(corpus.root / "manifest.json", {**corpus.manifest, "fingerprint": fingerprint,
                                               "shards": {**corpus.manifest.get("shards", {}), "train": entry}})
    if remove_bin:
        tokens_file(corpus.root, "train").unlink()
    return entry


def check_shards(corpus: Corpus) -> list[tuple[dict, str | None]]:
    """Each train shard's record with what is wrong with it ("is missing", a wrong size, a sha256
    that differs), or None when it is here and intact."""
    records = shard_records(corpus.manifest, "train")
    if records is None:
        raise DataError(f"corpus {corpus.name!r} is not sharded (its train split is one file); shard it with "
                        f"`lenx shard {corpus.name}`")
    view, out = corpus.tokens("train"), []
    for i, record in enumerate(records):
        why = view.problem(i)
        if why is None:
            h = hashlib.sha256()
            with open(view.path(i), "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            why = None if h.hexdigest() == record["sha256"] else "its sha256 differs from the manifest's"
        out.append((record, why))
    return out


def join_shards(name: str, root: Path) -> int:
    """Write corpus `name`'s train shards back into one train.bin and drop them (and their entry in
    the manifest). A train.bin still there is kept when it matches the fingerprint. Returns the
    number of shards joined."""
    corpus = open_corpus(name, root)
    records = shard_records(corpus.manifest, "train")
    if records is None:
        raise DataError(f"corpus {name!r} is not sharded: its train split is one file already")
    _tidy(corpus)
    want = corpus.fingerprint()["train"]
    bin_path = tokens_file(corpus.root, "train")
    if not (bin_path.is_file() and _file_fingerprint(corpus, bin_path) == want):
        view = corpus.tokens("train")
        absent = view.unreadable()
        if absent:
            raise DataError(f"cannot join corpus {name!r}: {len(absent)} of its {len(records)} train shards are not "
                            f"here or not whole ({', '.join(view.path(i).name for i in absent[:8])}"
                            f"{', ...' if len(absent) > 8 else ''} in {shards_dir(corpus.root, 'train')})")
        tmp, stream = corpus.root / f".train.bin{TMP_MARK}{os.getpid()}", hashlib.sha256()
        try:
            with open(tmp, "wb") as out:
                _copy(view, 0, len(view), out, (stream,))
            if _fingerprint_tail(stream, corpus) != want:
                raise DataError(f"the train shards of corpus {name!r} do not match its fingerprint (`lenx shard {name} "
                                "--check` says which differ); copy them again")
            os.replace(tmp, bin_path)
        finally:
            tmp.unlink(missing_ok=True)
    shards = {k: v for k, v in corpus.manifest.get("shards", {}).items() if k != "train"}
    manifest = {k: v for k, v in corpus.manifest.items() if k != "shards"}
    write_json(corpus.root / "manifest.json", {**manifest, **({"shards": shards} if shards else {})})
    shutil.rmtree(shards_dir(corpus.root, "train"), ignore_errors=True)
    return len(records)


def _file_fingerprint(corpus: Corpus, path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return _fingerprint_tail(h, corpus)
