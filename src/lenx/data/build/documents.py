"""A corpus's documents, read and cleaned: from the user's files, or fetched from the built-in
sources (every one of them, unless missing ones are allowed)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm.auto import tqdm

from ..errors import DataError
from .clean import clean_docs, normalise
from .fetch import Registries
from .inputs import read_user_data
from .sources import BUILTIN_SOURCES, Source

log = logging.getLogger("lenx.data")


def read_docs(name: str, from_path, reg: Registries, progress: bool, allow_missing: bool,
              skip_bad_records: bool = False):
    """The corpus's documents, read, normalised and deduplicated: (docs, source records,
    missing sources, cleaning stats)."""
    if from_path is not None:
        raw, record = read_user_data(Path(from_path), skip_bad_records)
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


def missing_sources(name: str, m: dict) -> list[str]:
    """The built-in sources of corpus `name` that manifest `m` does not record."""
    if name not in BUILTIN_SOURCES:
        return []
    have = {s.get("name") for s in m.get("sources", [])}
    return [s.name for s in BUILTIN_SOURCES[name]() if s.name not in have]


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
