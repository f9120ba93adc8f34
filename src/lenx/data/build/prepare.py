"""`lenx prepare`: build `<root>/<name>/` (lenx.data.layout) from a built-in corpus's sources or the
user's files, or generate the synthetic corpus.

A corpus is built in a hidden sibling folder `.<name>.build-<pid>` and swapped in only when
complete, so a failed prepare leaves the previous corpus as it was. Replacing a corpus prepared
with other settings needs force=True (`lenx prepare --force`).

`long_test=N` reserves N documents of at least `long_test_tokens` tokens for the test
split (so evaluation windows at long lengths can each come from their own document);
the rest is split as usual. The default is the corpus's (splits.long_test_default): 300 of
16385 tokens for `code`, else 0, which builds exactly the split it always did.

The `code` corpus also drops near-duplicate documents (lenx.data.build.neardup, MinHash LSH with
datasketch), after the non-text ones and the same way.

Non-text documents (lenx.data.build.nontext) are dropped after cleaning, unless
keep_non_text=True (`--keep-non-text`), which builds a corpus exactly as lenx did before the filter
existed: its params are the ones such a corpus recorded, so it counts as already prepared.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ...fileio import write_json
from ..corpus import CORPORA, check_name, unknown_corpus
from ..errors import DataError
from ..layout import FORMAT, SPLITS, check_files, fingerprint_files, read_manifest
from .documents import missing_sources, read_docs
from .fetch import Registries
from .neardup import check_available, find_near_duplicates
from .neardup import rule as near_dup_rule
from .nontext import find_non_text, rule
from .sources import NEAR_DUP
from .splits import LONG_TEST_TOKENS, check_docs, long_test_default
from .staging import build_aside
from .synthetic import VOCAB, build_synthetic
from .text import build_text
from .tokenizing import MAX_VOCAB, TOKENIZERS
from .writer import LONG

log = logging.getLogger("lenx.data")


def prepare_corpus(name: str, root: Path = Path("data"), *, from_path: Path | None = None,
                   tokenizer: str = "bpe", vocab_size: int = 16384, seed: int = 0,
                   val_frac: float = 0.02, test_frac: float = 0.05, cache_dir: Path | None = None,
                   progress: bool = True, force: bool = False, allow_missing_sources: bool = False,
                   long_test: int | None = None, long_test_tokens: int | None = None,
                   skip_bad_records: bool = False, keep_non_text: bool = False) -> dict:
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

    `long_test=N` (text corpora; None: the corpus's default, long_test_default) puts N documents
    of at least `long_test_tokens` tokens (None: the corpus's default),
    drawn by `seed`, into the test split before the rest is split as usual (so test gets
    them and its `test_frac` share of the rest); too few such documents is a DataError,
    raised before any tokenizing when the documents' sizes in bytes already tell.
    manifest["long_test"] records the reservation; every split records its number of
    documents of >= 8192 and >= 16384 tokens (and >= `long_test_tokens`).

    `skip_bad_records` (a JSONL `from_path`): leave out the lines that are not a JSON object with a
    string "text" and count them in the manifest's source record, instead of failing on the first.

    Text corpora drop their non-text documents (lenx.data.build.nontext: the rule, and why) unless
    `keep_non_text`; manifest["non_text"] records the rule, whether it was applied, the counts and
    the non-text documents, and params["non_text"] the rule when it was applied.

    The manifest's "fingerprint" pins the content (see Corpus.fingerprint).

    On any failure the corpus that was there before is left untouched.
    """
    t0 = time.time()
    root = Path(root)
    default_n, default_tokens = long_test_default(name)
    long_test = default_n if long_test is None else long_test
    long_test_tokens = default_tokens if long_test_tokens is None else long_test_tokens
    _check_args(name, from_path, tokenizer, vocab_size, val_frac, test_frac, root, long_test, long_test_tokens,
                skip_bad_records, keep_non_text)
    params = _params(from_path, tokenizer, vocab_size, seed, val_frac, test_frac, long_test, long_test_tokens)
    if name != "synthetic" and not keep_non_text:
        params["non_text"] = rule()
    if name in NEAR_DUP:
        params["near_dup"] = near_dup_rule()
    if name == "synthetic":
        params.update(tokenizer="none", vocab_size=VOCAB)
    folder = root / name
    old = read_manifest(folder)
    if old is not None and not force and _is_prepared(name, folder, old, params, allow_missing_sources):
        log.info("corpus %s is already prepared at %s", name, folder)
        return old
    if old is None or not force:
        _check_replace(name, folder, old, params, allow_missing_sources)

    if name != "synthetic":  # read and check the documents before any build folder exists
        reg = Registries(Path(cache_dir) if cache_dir else root / ".cache")
        docs, records, missing, cleaning = read_docs(name, from_path, reg, progress, allow_missing_sources,
                                                     skip_bad_records)
        drop, non_text = find_non_text(docs, keep=keep_non_text)
        if len(drop) == len(docs):
            raise DataError(f"no usable documents for {name!r}: all {len(docs)} are non-text "
                            f"({non_text['rule']} >= {non_text['max_share']}); check the input, or pass "
                            "--keep-non-text to keep them")
        near_dup = None
        if name in NEAR_DUP:  # dropped like the non-text documents: dealt into splits, then left out
            near, near_dup = find_near_duplicates(docs, skip=drop, progress=progress)
            drop = np.union1d(drop, near).astype(np.int64)
        kept = [docs[i] for i in np.setdiff1d(np.arange(len(docs)), drop)]
        check_docs(name, kept, val_frac, test_frac, long_test, long_test_tokens)
        del kept

    with build_aside(folder) as build:
        manifest = {"format": FORMAT, "name": name, "kind": "synthetic" if name == "synthetic" else "text",
                    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "params": params}
        if name == "synthetic":
            manifest.update(build_synthetic(build, seed, val_frac, test_frac))
        else:
            manifest.update(sources=records, missing_sources=missing, cleaning=cleaning, non_text=non_text)
            if near_dup is not None:
                manifest["near_dup"] = near_dup
            manifest.update(build_text(build, name, docs, tokenizer, vocab_size, seed, val_frac, test_frac,
                                       reg, progress, long_test, long_test_tokens, drop))
        for n in LONG:
            manifest[f"test_docs_ge_{n}_tokens"] = manifest["splits"]["test"][f"docs_ge_{n}_tokens"]
        manifest["fingerprint"] = fingerprint_files(build, manifest["tokenizer"]["kind"] != "none")
        manifest["seconds"] = round(time.time() - t0, 1)
        write_json(build / "manifest.json", manifest)
    log.info("prepared %s: %s", name, {s: manifest["splits"][s]["tokens"] for s in SPLITS})
    return manifest


def _is_prepared(name: str, folder: Path, m: dict, params: dict, allow_missing: bool) -> bool:
    """Whether the corpus on disk is complete and was built with these settings."""
    if m.get("params") != params or (missing_sources(name, m) and not allow_missing):
        return False
    try:
        check_files(name, folder, m)
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
        keep = (" (it was built before lenx dropped non-text documents: --keep-non-text builds it that way, "
                "and so counts it as prepared)" if "non_text" in params and "non_text" not in had else "")
        raise DataError(f"corpus {name!r} already exists at {folder} (prepared {created} with other settings: "
                        f"{'; '.join(changed)}){keep}; pass --force to replace it (runs trained on it will then "
                        "refuse to evaluate or generate with the new one), or choose another name")
    missing = missing_sources(name, old)
    if missing and not allow_missing:
        raise DataError(f"corpus {name!r} at {folder} was built without the sources {', '.join(missing)} "
                        "(--allow-missing-sources); building it whole replaces it: pass --force (runs trained on it "
                        "will then refuse the new one), or --allow-missing-sources to keep it as it is")


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
                long_test_tokens=LONG_TEST_TOKENS, skip_bad_records=False, keep_non_text=False) -> None:
    check_name(name)
    _check_long_test(name, long_test, long_test_tokens)
    if name in NEAR_DUP:
        check_available()
    if keep_non_text and name == "synthetic":
        raise DataError("--keep-non-text applies to text corpora; the synthetic corpus is generated token ids")
    if from_path is None and name not in CORPORA:
        raise unknown_corpus(name, root)
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
