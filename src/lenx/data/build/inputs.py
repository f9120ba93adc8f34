"""Documents from the user's own files (`lenx prepare NAME --from PATH`): a folder of text files, or a
JSONL file with a "text" field."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import DataError


def read_user_data(path: Path, skip_bad_records: bool = False) -> tuple[list, dict]:
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
