"""Documents from tables: parquet and arrow files, a folder of shards (parquet, arrow, JSONL), a
dataset saved by Hugging Face `datasets` (`save_to_disk`) and one in its local cache, read offline.

One document per row, its text in a string column (`--text-field`, default "text"). Files are read
a record batch at a time, never memory-mapped: a parquet file page by page within its row groups,
an arrow file (the IPC stream `datasets` writes, or the IPC file format) batch by batch. pyarrow,
and `datasets` for its cache, come with the optional extra `hf`; they are imported only here, inside
the functions."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import DataError
from .inputs import JSONL_SUFFIXES, UserInput, jsonl_records, skip_or_fail, text_problem

TABLE_SUFFIXES = (".parquet", ".arrow")
SHARD_SUFFIXES = TABLE_SUFFIXES + (".jsonl", ".jsonl.gz")
ROWS = 256  # rows converted to Python strings at a time
# Files a folder of shards may hold besides its shards: a Hugging Face dataset repository's, the
# `datasets` cache's metadata. Any other file makes it ambiguous (a folder of text files with a JSONL?).
SHARD_FOLDER_EXTRAS = re.compile(r"(README|LICEN[CS]E|CITATION)([-_.].*)?|.*\.(json|yaml|yml|lock)", re.IGNORECASE)
INSTALL = "pip install 'lenx[hf]'"
# The split names a folder of shards is read by as a DatasetDict when it names more than one of them.
USUAL_SPLITS = ("train", "validation", "valid", "val", "dev", "test")


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise DataError(f"reading parquet, arrow or Hugging Face datasets needs pyarrow: {INSTALL}") from None
    return pyarrow


def is_shard(path: Path) -> bool:
    return path.name.endswith(SHARD_SUFFIXES)


# --- one table file -----------------------------------------------------------------

def _kind(path: Path) -> str:
    return "parquet" if path.name.endswith(".parquet") else "arrow"


@contextmanager
def _reading(path: Path):
    """Errors of pyarrow while reading `path` as one-line DataErrors."""
    pa = _pyarrow()
    try:
        yield pa
    except (OSError, pa.ArrowException) as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"cannot read {path} as {_kind(path)} ({detail})") from e


def _is_ipc_file(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(6) == b"ARROW1"  # else the IPC stream format `datasets` writes


def _schema(path: Path):
    with _reading(path) as pa:
        if _kind(path) == "parquet":
            return pa.parquet.read_schema(str(path))
        with pa.OSFile(str(path)) as src:
            return (pa.ipc.open_file if _is_ipc_file(path) else pa.ipc.open_stream)(src).schema


def _batches(path: Path, column: str):
    """The record batches of one column of a parquet or arrow file, read (never mapped) one at a time."""
    with _reading(path) as pa:
        if _kind(path) == "parquet":
            # Buffered reads without pre-buffering: a row group's column is read page by page.
            with pa.parquet.ParquetFile(str(path), buffer_size=1 << 20, pre_buffer=False) as pf:
                yield from pf.iter_batches(batch_size=ROWS, columns=[column], use_threads=False)
            return
        with pa.OSFile(str(path)) as src:
            if _is_ipc_file(path):
                reader = pa.ipc.open_file(src)
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i).select([column])
            else:
                for batch in pa.ipc.open_stream(src):
                    yield batch.select([column])


def _check_column(schema, path: Path, field: str) -> None:
    """The text column is there and holds strings; a one-line DataError before any work otherwise."""
    pa = _pyarrow()
    names = schema.names
    if field not in names:
        shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        nested = ("; nested fields are not read: flatten the table first (datasets' .flatten() names that "
                  f"column {field})") if "." in field else ""
        raise DataError(f"{path} has no column \"{field}\" (its columns: {shown}); name the text column "
                        f"with --text-field{nested}")
    t = schema.field(field).type
    value_type = t.value_type if pa.types.is_dictionary(t) else t
    is_view = getattr(pa.types, "is_string_view", lambda _: False)  # pyarrow >= 16
    if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type) or is_view(value_type)
            or pa.types.is_null(value_type)):
        raise DataError(f"{path} row 0: \"{field}\" is {t}, not a string (the whole column is {t}); name the text "
                        "column with --text-field")


def table_records(path: Path, label: str, field: str, skip: bool, counts: dict | None) -> Iterator[tuple[str, str]]:
    """The documents of one parquet or arrow file, ROWS at a time, named `label`:ROW (rows count
    from 0); a bad record is named by the file's path and row."""
    _check_column(_schema(path), path, field)
    row = 0
    for batch in _batches(path, field):
        column = batch.column(0)
        for start in range(0, len(column), ROWS):
            for text in column.slice(start, ROWS).to_pylist():
                problem = text_problem(text, field)
                if problem is not None:
                    skip_or_fail(counts, skip, f"{path} row {row}", problem)
                else:
                    if counts is not None:
                        counts["records"] += 1
                    yield f"{label}:{row}", text
                row += 1


def _files_record(path: str, fmt: str, files: list[Path], field: str, split: str | None) -> dict:
    record = {"name": "user", "path": path, "format": fmt, "files": len(files), "text_field": field}
    if split is not None:
        record["split"] = split
    return record | {"records": 0, "bad_records_skipped": 0}


def _files_input(what: str, record: dict, files: list[Path], base: Path, field: str, skip: bool) -> UserInput:
    """An input of several shard files, read in the order given; a file's documents are named by its
    path below `base`."""
    for f in files:  # every table's text column is checked before any work
        if not f.name.endswith(JSONL_SUFFIXES):
            _check_column(_schema(f), f, field)

    def read(counts: dict | None):
        for f in files:
            label = str(f.relative_to(base)) if f.is_relative_to(base) else f.name
            if f.name.endswith(JSONL_SUFFIXES):
                yield from jsonl_records(f, label, field, skip, counts)
            else:
                yield from table_records(f, label, field, skip, counts)
    return UserInput(what, record, read, files=files)


def table_file(path: Path, field: str, skip: bool) -> UserInput:
    return _files_input(str(path), _files_record(str(path.resolve()), _kind(path), [path], field, None), [path],
                        path.parent, field, skip)


# --- a folder of shards -------------------------------------------------------------

def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def split_of(path: Path, f: Path, split: str) -> bool:
    """Whether shard `f` of the folder `path` belongs to `split` (by its folder or its name)."""
    return split in f.relative_to(path).parts[:-1] or split in re.split(r"[-_.]", f.name)


def shard_folder(path: Path, files: list[Path], field: str, split: str | None, skip: bool) -> UserInput:
    """The shards (parquet, arrow, JSONL) of a folder, in path order. With `split`, only those whose
    folder or file name says that split: `train/...`, `train-00000-of-00002.parquet`, `train.jsonl`,
    `wikitext-train-00000-of-00002.arrow` (the `datasets` cache). Without it, a folder whose shards
    name several of the usual splits (a hub snapshot with train/ and test/) is read as a DatasetDict
    is: its train split (the record's "other_splits" lists the rest), else an error asking for one."""
    shards = [f for f in files if is_shard(f)]
    others = [f for f in files if not is_shard(f) and not SHARD_FOLDER_EXTRAS.fullmatch(f.name)]
    if others:
        raise DataError(f"{path} holds data shards ({_plural(len(shards), 'parquet, arrow or JSONL file')}) and "
                        f"{_plural(len(others), 'other file')} ({others[0].relative_to(path)}, ...); give a folder "
                        "of shards only, or a folder of text files only")
    found = [s for s in USUAL_SPLITS if any(split_of(path, f, s) for f in shards)]
    other_splits = []
    if split is None and len(found) > 1:
        if "train" not in found:
            raise DataError(f"{path} holds the shards of the splits {', '.join(found)}; choose one with --split")
        split, other_splits = "train", [s for s in found if s != "train"]
    if split is not None:
        chosen = [f for f in shards if split_of(path, f, split)]
        if not chosen:
            raise DataError(f"no shard of {path} belongs to split {split!r} (none is in a folder {split}/ or has "
                            f"{split!r} in its name, as in {split}-00000-of-00001.parquet); check --split")
        shards = chosen
    record = _files_record(str(path.resolve()), "shards", shards, field, split)
    if other_splits:
        record["other_splits"] = other_splits
    return _files_input(str(path), record, shards, path, field, skip)


# --- Hugging Face datasets ----------------------------------------------------------

def is_saved_dataset(path: Path) -> bool:
    """A folder written by `datasets`' save_to_disk: a Dataset or a DatasetDict."""
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _choose_split(what: str, splits: list[str], split: str | None) -> str:
    """--split, or the only split, or train."""
    if split is None:
        if len(splits) == 1:
            return splits[0]
        if "train" in splits:
            return "train"
        raise DataError(f"{what} has the splits {', '.join(splits)}; choose one with --split")
    if split not in splits:
        raise DataError(f"{what} has no split {split!r}; its splits: {', '.join(splits)}")
    return split


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {path} ({e}); is the dataset folder complete?") from e


def saved_dataset(path: Path, field: str, split: str | None, skip: bool) -> UserInput:
    """A dataset saved by `datasets`' save_to_disk, read from its arrow files (needs pyarrow only)."""
    folder, chosen = path, None
    if (path / "dataset_dict.json").is_file():
        splits = _read_json(path / "dataset_dict.json").get("splits", [])
        chosen = _choose_split(f"the saved DatasetDict {path}", splits, split)
        folder = path / chosen
    elif split is not None:
        raise DataError(f"{path} is a saved Dataset of one split; --split applies to a saved DatasetDict, an "
                        "hf: dataset or a folder of shards")
    state = _read_json(folder / "state.json")
    if state.get("_indices_data_files"):
        raise DataError(f"{folder} was saved with an indices mapping; save it again after .flatten_indices()")
    files = [folder / f["filename"] for f in state.get("_data_files", [])]
    missing = [f for f in files if not f.is_file()]
    if not files or missing:
        raise DataError(f"{folder}/state.json names {'no data files' if not files else f'missing {missing[0].name}'}; "
                        "is the dataset folder complete?")
    return _files_input(str(path), _files_record(str(path.resolve()), "save_to_disk", files, field, chosen), files,
                        path, field, skip)


@contextmanager
def _offline(datasets):
    """datasets and huggingface_hub in offline mode (their flags are read at import: set them here)."""
    import huggingface_hub.constants as hub

    old = datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = old


def cached_dataset(spec: str, field: str, split: str | None, skip: bool) -> UserInput:
    """`hf:NAME` or `hf:NAME:CONFIG`: a dataset in the Hugging Face `datasets` cache, loaded offline
    (nothing is downloaded) and read from its arrow files."""
    name, _, config = spec.removeprefix("hf:").partition(":")
    if not name:
        raise DataError(f"--from {spec}: name the dataset, as in hf:wikitext:wikitext-2-raw-v1")
    if Path(name).exists():
        raise DataError(f"--from {spec}: {name} is also a path here, which `datasets` would read instead of its cache; "
                        f"give the path itself (--from {name}), or run lenx from another folder")
    _pyarrow()
    try:
        import datasets
    except ImportError:
        raise DataError(f"reading a dataset from the Hugging Face cache needs datasets: {INSTALL}") from None
    datasets.logging.set_verbosity_error()  # its note that the cache is used, on every load
    try:
        with _offline(datasets):
            loaded = datasets.load_dataset(name, config or None)
    except Exception as e:  # datasets raises many types; all mean the same here
        raise DataError(f"--from {spec}: {name}{':' + config if config else ''} is not in the Hugging Face datasets "
                        f"cache, read offline ({str(e).splitlines()[0] if str(e) else type(e).__name__}); load it once "
                        "with datasets.load_dataset while online, or give its files") from e
    chosen = _choose_split(f"--from {spec}", list(loaded), split)
    files = [Path(f["filename"]) for f in loaded[chosen].cache_files]
    if not files:
        raise DataError(f"--from {spec}: the split {chosen!r} has no arrow files in the cache")
    return _files_input(spec, _files_record(spec, "hf cache", files, field, chosen), files, files[0].parent, field,
                        skip)
