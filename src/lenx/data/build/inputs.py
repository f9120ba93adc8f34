"""Documents from the user's own files (`lenx prepare NAME --from PATH`): a folder of text files (one
document a file) and JSONL (one document a line, its text in a field); lenx.data.build.tables reads
parquet, arrow and Hugging Face datasets, and lenx.data.build.documents chooses the reader.

Every reader streams: it yields (doc_id, text) records one at a time, and the build reads them
again for each of its passes (lenx.data.build.scan), so a corpus larger than memory builds in
bounded memory. A record whose text field is missing or not a string is a one-line DataError naming
it, unless --skip-bad-records: then it is left out and counted in the manifest's source record."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import DataError

LISTED_BAD = 20  # the source record lists the first bad records it skipped
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json")

Reader = Callable[["dict | None"], Iterator[tuple[str, str]]]


class UserInput:
    """The user's data: its records, read again on every call of `records`, and the manifest's
    record of the source. The first pass, which reads every record, fills in the record's counts."""

    def __init__(self, what: str, record: dict, reader: Reader, record_kind: str = "records",
                 files: list[Path] | None = None):
        self.what, self.record, self._reader = what, record, reader
        self.record_kind = record_kind  # what --skip-bad-records leaves out: "lines" or "records"
        self.files = list(files or [])  # the files read, which the input's fingerprint covers (input_id)
        self._counted = False

    def records(self) -> Iterator[tuple[str, str]]:
        counts, self._counted = (None if self._counted else self.record), True
        return self._reader(counts)


def skip_or_fail(counts: dict | None, skip: bool, where: str, problem: str, unit: str = "record",
                 listed_as: str | int | None = None) -> None:
    """A bad record: a one-line DataError, or (`skip`) one more in the source record's counts."""
    if not skip:
        raise DataError(f"{where}: {problem}; fix or remove that {unit}, or pass --skip-bad-records to leave "
                        f"such {unit}s out")
    if counts is not None:
        counts["bad_records_skipped"] += 1
        counts.setdefault("first_bad_record", f"{where}: {problem}")
        key = "bad_record_lines" if unit == "line" else "bad_records"
        listed = counts.setdefault(key, [])
        if len(listed) < LISTED_BAD:
            listed.append(where if listed_as is None else listed_as)


def text_problem(value, field: str, has_field: bool = True) -> str | None:
    """Why a record's `field` value is not a document's text (a string), or None."""
    if not has_field:
        nested = " (nested fields are not read: flatten the records first)" if "." in field else ""
        return f"has no \"{field}\" field{nested}"
    if isinstance(value, str):
        return None
    if value is None:
        return f"\"{field}\" is null, not a string"
    shown = json.dumps(value, ensure_ascii=False, default=repr)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"\"{field}\" is {_json_type(value)} ({shown}), not a string"


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


# --- a folder of text files ---------------------------------------------------------

def text_folder(path: Path) -> UserInput:
    """One document per file of the folder (recursive, hidden files aside). A file that is not UTF-8
    is text in a legacy encoding: kept, its bytes given to cleaning, which replaces the invalid ones
    with U+FFFD and counts the document. A binary file (a NUL byte in its first 8 KiB) is skipped and
    counted (the first SKIPPED_LISTED are named), never mangled."""
    files = sorted(p for p in path.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(path).parts))

    def read(counts: dict | None) -> Iterator[tuple[str, str | bytes]]:
        for p in files:
            data = p.read_bytes()
            name = str(p.relative_to(path))
            if b"\x00" in data[:8192]:
                if counts is not None:
                    counts["files_skipped_not_text"] += 1
                    if len(counts["skipped_files"]) < LISTED_BAD:
                        counts["skipped_files"].append(name)
                continue
            yield name, data

    record = {"name": "user", "path": str(path.resolve()), "files": len(files), "files_skipped_not_text": 0,
              "skipped_files": []}
    return UserInput(str(path), record, read, files=files)


# --- JSONL --------------------------------------------------------------------------

def jsonl_records(path: Path, label: str, field: str, skip: bool, counts: dict | None,
                  single: bool = False) -> Iterator[tuple[str, str]]:
    """The documents of a JSONL file (gzipped when it ends in .gz), one line at a time, named
    `label`:LINE; blank lines are no records, a bad one is named by the file's path and line.
    `single`: the only file of the input (its bad lines are listed by number).

    A line that is not UTF-8 is read with its invalid bytes kept aside (surrogateescape) and its text
    yielded as bytes, so cleaning replaces them with U+FFFD and counts the document."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        for i, raw in enumerate(f):
            if not raw.strip():
                continue
            try:
                line, valid = raw.decode("utf-8"), True
            except UnicodeDecodeError:
                line, valid = raw.decode("utf-8", "surrogateescape"), False
            text, problem = None, None
            try:
                record = json.loads(line)
            except ValueError as e:
                problem = f"is not JSON ({e})"
            else:
                if not isinstance(record, dict):
                    problem = f"is {_json_type(record)}, not a JSON object with a \"{field}\" field"
                else:
                    text = record.get(field)
                    problem = text_problem(text, field, field in record)
            if problem is not None:
                where = f"{path} line {i + 1}"
                skip_or_fail(counts, skip, where, problem, unit="line" if single else "record",
                             listed_as=i + 1 if single else None)
                continue
            if counts is not None:
                counts["lines" if single else "records"] += 1
            yield f"{label}:{i + 1}", text if valid else _raw(text)


def _raw(text: str) -> bytes:
    """The bytes of a text read with surrogateescape (invalid UTF-8 stays invalid, for cleaning to count)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate written as a \u escape as well: invalid either way
        return text.encode("utf-8", "surrogatepass")


def jsonl_file(path: Path, field: str, skip: bool) -> UserInput:
    def read(counts: dict | None):
        return jsonl_records(path, path.name, field, skip, counts, single=True)

    record = {"name": "user", "path": str(path.resolve()), "lines": 0, "bad_records_skipped": 0}
    if field != "text":
        record["text_field"] = field
    return UserInput(str(path), record, read, record_kind="lines", files=[path])
