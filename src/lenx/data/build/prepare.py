"""`lenx prepare`: build `<root>/<name>/` (lenx.data.layout) from a built-in corpus's sources or the
user's files, or generate the synthetic corpus.

The documents are streamed (lenx.data.build.scan): a corpus larger than memory builds in memory
that grows by a few dozen bytes per document, whatever their size.

A corpus is built in a hidden sibling folder `.<name>.build-<pid>` and swapped in only when
complete, so a failed prepare leaves the previous corpus as it was. Replacing a corpus prepared
with other settings needs force=True (`lenx prepare --force`).

`long_test=N` reserves N documents of at least `long_test_tokens` tokens for the test
split (so evaluation windows at long lengths can each come from their own document);
the rest is split as usual. The default is the corpus's (splits.long_test_default): 300 of
16385 tokens for `code`, else 0, which builds exactly the split it always did.

The `code` corpus also drops near-duplicate documents (lenx.data.build.neardup, MinHash LSH with
datasketch), found in the same scan and dropped the way the non-text ones are; while the scan runs,
its index holds a few KB per document.

Non-text documents (lenx.data.build.nontext) are dropped after cleaning, unless
keep_non_text=True (`--keep-non-text`), which builds a corpus exactly as lenx did before the filter
existed: its params are the ones such a corpus recorded, so it counts as already prepared.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ...fileio import write_json
from ..corpus import CORPORA, check_name, unknown_corpus
from ..errors import DataError
from ..layout import FORMAT, SPLITS, check_files, fingerprint_files, read_manifest
from .documents import missing_sources, open_user_data, read_docs
from .fetch import Registries
from .input_id import input_change, input_record
from .neardup import check_available
from .neardup import rule as near_dup_rule
from .nontext import rule
from .sources import NEAR_DUP
from .splits import LONG_TEST_TOKENS, check_docs, long_test_default
from .staging import build_aside
from .synthetic import VOCAB, build_synthetic
from .text import build_text
from .tokenizer_file import open_tokenizer
from .tokenizing import MAX_VOCAB, TOKENIZERS, check_long_docs
from .writer import LONG

log = logging.getLogger("lenx.data")

DEFAULT_VOCAB = 16384  # of the BPE trained here (and recorded, unused, with GPT-2's)


def prepare_corpus(name: str, root: Path = Path("data"), *, from_path: Path | str | None = None,
                   tokenizer: str = "bpe", vocab_size: int | None = None, seed: int = 0,
                   val_frac: float = 0.02, test_frac: float = 0.05, cache_dir: Path | None = None,
                   progress: bool = True, force: bool = False, allow_missing_sources: bool = False,
                   long_test: int | None = None, long_test_tokens: int | None = None,
                   skip_bad_records: bool = False, keep_non_text: bool = False,
                   text_field: str | None = None, split: str | None = None,
                   say: Callable[[str], None] | None = None) -> dict:
    """Build `<root>/<name>/` and return its manifest.

    Built-in names are in CORPORA; any other name needs `from_path`: a folder of text files, a
    JSONL, parquet or arrow file, a folder of such shards, a folder saved by `datasets`'
    save_to_disk, or "hf:NAME[:CONFIG]", a dataset in the Hugging Face cache read offline
    (lenx.data.build.documents). Records hold their text in the field `text_field` (default
    "text"); `split` picks a dataset's split (default: its only one, or train).

    `tokenizer` is "bpe" (trained on the train split, `vocab_size` ids, default 16384), "gpt2", or
    the path of a tokenizer.json or a transformers tokenizer folder, used as it is (its vocabulary
    size is its own; over 65536 ids the token files are uint32). Downloads are cached in `cache_dir`
    (default `<root>/.cache`). If the corpus is already prepared with the same
    settings it is returned as is, unless `force`, and `say` (default: the log) is told so; a corpus of
    that name prepared with other settings, or from the same path whose files have changed since
    (lenx.data.build.input_id, the manifest's "input"), is replaced only with `force` (a DataError
    otherwise, before any work), and a folder that is not a corpus never. A corpus prepared before
    lenx recorded its input has no "input": it is reused as it is (what its input was then is not
    known, and refusing every such corpus would make its runs' users rebuild it for nothing).

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

    `skip_bad_records` (records: JSONL, parquet, arrow, datasets): leave out the records whose text
    field is missing or not a string and count them in the manifest's source record, instead of
    failing on the first.

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
                skip_bad_records, keep_non_text, text_field, split)
    user = open_user_data(from_path, text_field, split, skip_bad_records) if from_path is not None else None
    if tokenizer not in TOKENIZERS:
        tokenizer = str(Path(tokenizer).expanduser().resolve())
    params = _params(from_path, tokenizer, vocab_size, seed, val_frac, test_frac, long_test, long_test_tokens,
                     text_field, split)
    if name != "synthetic" and not keep_non_text:
        params["non_text"] = rule()
    if name in NEAR_DUP:
        params["near_dup"] = near_dup_rule()
    if name == "synthetic":
        params.update(tokenizer="none", vocab_size=VOCAB)
    folder = root / name
    old = read_manifest(folder)
    if old is not None and not force and _is_prepared(name, folder, old, params, allow_missing_sources):
        (say or log.info)(_reused(name, folder, old, from_path, user))
        return old
    if old is None or not force:
        _check_replace(name, folder, old, params, allow_missing_sources)
    input_files = input_record(user.files) if user is not None else None

    if name != "synthetic":  # read and check the documents before any build folder exists
        reg = Registries(Path(cache_dir) if cache_dir else root / ".cache")
        docs, records, missing = read_docs(name, user, reg, progress, allow_missing_sources, keep_non_text,
                                           long_test_tokens if long_test else 0, near_dup=name in NEAR_DUP)
        if len(docs.drop) == len(docs):
            raise DataError(f"no usable documents for {name!r}: all {len(docs)} are non-text "
                            f"({docs.non_text['rule']} >= {docs.non_text['max_share']}); check the input, or pass "
                            "--keep-non-text to keep them")
        check_long_docs(docs, tokenizer)
        byte_level = tokenizer in TOKENIZERS
        check_docs(name, len(docs) - len(docs.drop), docs.long_bytes if byte_level else None, val_frac, test_frac,
                   long_test, long_test_tokens)

    with build_aside(folder) as build:
        manifest = {"format": FORMAT, "name": name, "kind": "synthetic" if name == "synthetic" else "text",
                    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "params": params}
        if name == "synthetic":
            manifest.update(build_synthetic(build, seed, val_frac, test_frac))
        else:
            if input_files is not None:
                manifest["input"] = input_files
            manifest.update(sources=records, missing_sources=missing, cleaning=docs.cleaning, non_text=docs.non_text)
            if docs.near_dup is not None:
                manifest["near_dup"] = docs.near_dup
            manifest.update(build_text(build, name, docs, tokenizer, params["vocab_size"], seed, val_frac, test_frac,
                                       reg, progress, long_test, long_test_tokens))
        manifest.setdefault("token_dtype", "uint16")  # the synthetic corpus's
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


def _reused(name: str, folder: Path, m: dict, from_path, user) -> str:
    """The line saying that the corpus prepared already is reused; a DataError when the user's input
    has changed since it was prepared."""
    created = m.get("created", "at an unknown time")
    source = f" from {from_path}" if from_path is not None else ""
    note = ""
    if user is not None and not isinstance(m.get("input"), dict):
        note = " (prepared before lenx recorded its input's content, so a changed input goes unnoticed)"
    elif user is not None:
        change = input_change(m["input"], user.files)
        if change is not None:
            raise DataError(f"corpus {name!r} at {folder} was prepared {created}{source}, which has changed since "
                            f"({change}); pass --force to rebuild it (runs trained on it will then refuse to "
                            "evaluate or generate with the new one), or choose another name")
    return f"corpus {name} already prepared{source} on {created}: reused{note}; --force rebuilds"


CORPUS_FILES = re.compile(r"manifest\.json|tokenizer\.json|(train|val|test)\.(bin|idx\.npy)|train\.shards|\..*\.tmp-\d+")


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
            long_test_tokens=LONG_TEST_TOKENS, text_field=None, split=None) -> dict:
    if from_path is not None:
        from_path = str(from_path) if str(from_path).startswith("hf:") else str(Path(from_path).expanduser().resolve())
    params = {"from_path": from_path, "tokenizer": tokenizer, "vocab_size": vocab_size, "seed": seed,
              "val_frac": val_frac, "test_frac": test_frac}
    if tokenizer not in TOKENIZERS:  # the user's: pinned by its content, its vocabulary is its own
        record = open_tokenizer(tokenizer)[1]
        params.update(vocab_size=record["vocab_size"], tokenizer_sha256=record["sha256"])
    elif vocab_size is None:
        params["vocab_size"] = DEFAULT_VOCAB
    # Only when asked for: a corpus prepared before an option existed still counts as prepared.
    if long_test:
        params.update(long_test=int(long_test), long_test_tokens=int(long_test_tokens))
    if text_field is not None and text_field != "text":
        params["text_field"] = text_field
    if split is not None:
        params["split"] = split
    return params


def _check_long_test(name: str, long_test, long_test_tokens) -> None:
    for option, value, low in (("--long-test", long_test, 0), ("--long-test-tokens", long_test_tokens, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise DataError(f"{option} must be an integer >= {low}, got {value!r}")
    if long_test and name == "synthetic":
        raise DataError("--long-test applies to text corpora; the synthetic corpus generates its long test "
                        "documents itself")


def _check_args(name, from_path, tokenizer, vocab_size, val_frac, test_frac, root, long_test=0,
                long_test_tokens=LONG_TEST_TOKENS, skip_bad_records=False, keep_non_text=False, text_field=None,
                split=None) -> None:
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
    if from_path is None and (skip_bad_records or text_field is not None or split is not None):
        raise DataError("--skip-bad-records, --text-field and --split apply to your own data given with --from")
    if name == "synthetic" and (tokenizer != "bpe" or vocab_size is not None):
        raise DataError(f"--tokenizer and --vocab-size apply to text corpora; the synthetic corpus is generated "
                        f"token ids (a vocabulary of {VOCAB})")
    if tokenizer not in TOKENIZERS and not Path(tokenizer).expanduser().exists():
        raise DataError(f"unknown tokenizer {tokenizer!r}; use one of {', '.join(TOKENIZERS)}, or the path of a "
                        "tokenizer.json or a transformers tokenizer folder")
    if tokenizer not in TOKENIZERS and vocab_size is not None:
        raise DataError(f"--vocab-size applies to the BPE trained here; the tokenizer {tokenizer} has its own")
    vocab_size = DEFAULT_VOCAB if vocab_size is None else vocab_size
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
        raise DataError(f"vocab_size must be an integer, got {vocab_size!r}")
    if vocab_size > MAX_VOCAB:
        raise DataError(f"vocab_size {vocab_size} is too big: token ids are stored as uint32 at most, so use at "
                        f"most {MAX_VOCAB}")
    if tokenizer == "bpe" and vocab_size < 258:
        raise DataError(f"vocab_size {vocab_size} is too small: byte-level BPE needs at least 258 "
                        "(256 bytes + EOS + 1)")
    if not (0 <= val_frac < 1 and 0 <= test_frac < 1 and val_frac + test_frac < 1):
        raise DataError(f"val_frac={val_frac} and test_frac={test_frac} must be in [0, 1) and sum to less than 1")
