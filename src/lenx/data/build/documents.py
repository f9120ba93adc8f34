"""A corpus's documents: the user's data (`--from`: the reader for its format is chosen here) or the
fetched built-in sources (every one of them, unless missing ones are allowed), scanned once
(lenx.data.build.scan) and read again by each later pass of the build."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from pathlib import Path

from tqdm.auto import tqdm

from ..errors import DataError
from .clean import normalise
from .fetch import Registries
from .inputs import JSONL_SUFFIXES, UserInput, jsonl_file, text_folder
from .scan import Documents, Records, scan
from .sources import BUILTIN_SOURCES, Source
from .tables import SHARD_SUFFIXES, TABLE_SUFFIXES, cached_dataset, is_saved_dataset, is_shard, saved_dataset, \
    shard_folder, table_file

log = logging.getLogger("lenx.data")

FORMATS = ("a folder of text files, a JSONL, parquet or arrow file, a folder of such shards, a folder saved by "
           "datasets' save_to_disk, or hf:NAME[:CONFIG] (a dataset in the Hugging Face cache)")


def open_user_data(from_path, text_field: str | None = None, split: str | None = None,
                   skip_bad_records: bool = False) -> UserInput:
    """The reader of the user's data, chosen by what `from_path` is; everything that can be checked
    without reading the documents (the path, the format, the split, the text column of a table) is
    checked here, as a one-line DataError."""
    spec = str(from_path)
    field = "text" if text_field is None else text_field
    if not field:
        raise DataError("--text-field must name a field")
    if spec.startswith("hf:"):
        return cached_dataset(spec, field, split, skip_bad_records)
    path = Path(spec).expanduser()
    if not path.exists():
        raise DataError(f"--from path {spec} does not exist; give {FORMATS}")
    records_only = "--text-field, --split and --skip-bad-records apply to records (JSONL, parquet, arrow, datasets)"
    if path.is_dir() and is_saved_dataset(path):
        return saved_dataset(path, field, split, skip_bad_records)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if any(is_shard(f) for f in files):
            return shard_folder(path, files, field, split, skip_bad_records)
        if text_field is not None or split is not None or skip_bad_records:
            raise DataError(f"{path} is a folder of text files (one document each, no records); {records_only}")
        return text_folder(path)
    if split is not None:
        raise DataError(f"--split applies to a dataset with splits (a save_to_disk DatasetDict folder, hf:NAME, or a "
                        f"folder of shards); {path} is one file")
    if path.name.endswith(TABLE_SUFFIXES):
        return table_file(path, field, skip_bad_records)
    if path.name.endswith(JSONL_SUFFIXES):
        return jsonl_file(path, field, skip_bad_records)
    raise DataError(f"--from path {path} is not a format lenx reads (by its name: {', '.join(SHARD_SUFFIXES)}); "
                    f"give {FORMATS}")


def read_docs(name: str, user: UserInput | None, reg: Registries, progress: bool, allow_missing: bool,
              keep_non_text: bool = False, min_bytes: int = 0, near_dup: bool = False) -> tuple[Documents, list, list]:
    """The corpus's documents, scanned (cleaned, deduplicated, non-text and, with `near_dup`,
    near-duplicates found): (documents, source records, missing sources)."""
    if user is not None:
        docs = scan(user.what, user.records, keep_non_text, min_bytes, progress, near_dup)
        records, missing = [user.record], []
        records[0].update(docs=len(docs), chars=int(docs.lengths.sum()))
    else:
        raw, records, missing = _gather_builtin(name, BUILTIN_SOURCES[name](), reg, progress, allow_missing)
        docs = scan(f"the sources of {name}", raw, keep_non_text, min_bytes, progress, near_dup)
    if not len(docs):
        source = records[0] if user is not None else {}
        skipped = source.get("bad_records_skipped", 0)
        if skipped and not source.get("lines", source.get("records")):
            raise DataError(f"no usable documents for {name!r}: all {skipped:,} records of {user.what} were skipped "
                            f"as bad (--skip-bad-records; the first: {source.get('first_bad_record')}); check "
                            "--text-field")
        raise DataError(f"no usable documents for {name!r} (all empty or duplicates); check the input")
    return docs, records, missing


def input_notes(manifest: dict, shown: str | None = None) -> list[str]:
    """Lines for `lenx prepare` to print about what it did with the user's input (`shown`: its path as
    given): files skipped as not text, documents kept with replacements for bytes that are not UTF-8,
    and the split a folder of shards was read by default."""
    lines = []
    for source in manifest.get("sources", []):
        path = shown or source.get("path")
        n = source.get("files_skipped_not_text", 0)
        if n:
            listed = source.get("skipped_files", [])
            more = ", ..." if n > len(listed) else ""
            lines.append(f"skipped {n:,} file{'s' if n != 1 else ''} of {path} that {'is' if n == 1 else 'are'} not "
                         f"text (a NUL byte in the first 8 KiB): {', '.join(listed)}{more}")
        if source.get("other_splits"):
            lines.append(f"read split {source.get('split')} of {path} (also there: {', '.join(source['other_splits'])}); "
                         "--split to choose")
    n = manifest.get("cleaning", {}).get("not_utf8_kept_with_replacements", 0)
    if n:
        lines.append(f"kept {n:,} document{'s' if n != 1 else ''} with bytes that are not UTF-8, each replaced by "
                     "U+FFFD (cleaning.not_utf8_kept_with_replacements in the manifest)")
    return lines


def missing_sources(name: str, m: dict) -> list[str]:
    """The built-in sources of corpus `name` that manifest `m` does not record."""
    if name not in BUILTIN_SOURCES:
        return []
    have = {s.get("name") for s in m.get("sources", [])}
    return [s.name for s in BUILTIN_SOURCES[name]() if s.name not in have]


def _gather_builtin(name: str, sources: list[Source], reg: Registries, progress: bool,
                     allow_missing: bool) -> tuple[Records, list, list]:
    """Fetch and read every source (two at a time: decompression releases the GIL); return the
    reader of all their documents in order (a source that reads its documents again from its files
    on every pass is read once here, to count them).

    Any source that fails makes this fail, naming each failed source and why, unless
    `allow_missing`: then they are left out (and listed in the manifest), as long as
    one source is left.
    """
    parts, records, missing = [], [], []

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
        t, n_docs, chars = time.time(), 0, 0
        for _, d in (src_docs() if callable(src_docs) else src_docs):
            n_docs, chars = n_docs + 1, chars + len(normalise(d))
        if callable(src_docs):  # a reader: reading its files is part of the source's time
            secs += time.time() - t
        records.append({"name": src.name, "files": [f.record() for f in files],
                        "docs": n_docs, "chars": chars, "seconds": round(secs, 1)})
        parts.append(src_docs)
    if missing and (not allow_missing or not records):
        hint = ("fix that and run again" if not records else
                "fix that and run again, or pass --allow-missing-sources to build without them")
        reasons = " | ".join(f"{m['source']}: {m['reason']}" for m in missing)
        raise DataError(f"corpus {name!r} is incomplete, {len(missing)} of {len(sources)} sources failed; "
                        f"{hint} | {reasons}")
    for m in missing:
        log.warning("building %s without source %s: %s", name, m["source"], m["reason"])
    return lambda: chain.from_iterable(p() if callable(p) else p for p in parts), records, missing
