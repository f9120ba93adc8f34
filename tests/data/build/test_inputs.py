"""`lenx prepare --from` in every format: JSONL, parquet, arrow (IPC stream and file), a folder of
shards, a dataset saved by `datasets`, one in its cache (offline); the text field, the split, bad
records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

from corpus_helpers import leftovers, split_texts
from lenx.data import DataError, open_corpus
from lenx.data.build import prepare_corpus
from lenx.data.build.documents import open_user_data

SRC = Path(__file__).resolve().parents[3] / "src"
KW = dict(vocab_size=300, progress=False)


def texts() -> list[str]:
    """40 documents of words, one of them twice (a duplicate) and one empty."""
    out = [" ".join(f"w{(i * 13 + j * j) % 71}" for j in range(20 + (i * 7) % 90)) for i in range(40)]
    out[9] = out[3]
    out[17] = "  \n"
    return out


def write_jsonl(path: Path, docs: list, field: str = "text") -> Path:
    path.write_text("".join(json.dumps({"id": i, field: t}) + "\n" for i, t in enumerate(docs)))
    return path


def table(docs: list, field: str = "text") -> pa.Table:
    return pa.table({"id": list(range(len(docs))), field: pa.array(docs, type=pa.string())})


def write_arrow(path: Path, t: pa.Table, file_format: bool, batch: int = 7) -> Path:
    with pa.OSFile(str(path), "wb") as sink:
        new = pa.ipc.new_file if file_format else pa.ipc.new_stream
        with new(sink, t.schema) as w:
            for b in t.to_batches(max_chunksize=batch):
                w.write_batch(b)
    return path


def corpus_content(root: Path, name: str) -> dict:
    """What a corpus is, without where it came from: its fingerprint and each split's texts."""
    c = open_corpus(name, root)
    return {"fingerprint": c.fingerprint(), **{s: split_texts(c, s) for s in ("train", "val", "test")}}


def test_every_format_builds_the_same_corpus(tmp_path):
    docs = texts()
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "docs.jsonl", docs)
    reference = prepare_corpus("ref", tmp_path / "data", from_path=src / "docs.jsonl", **KW)
    want = corpus_content(tmp_path / "data", "ref")
    assert reference["cleaning"]["duplicates_dropped"] == 1 and reference["cleaning"]["empty_dropped"] == 1

    pq.write_table(table(docs, "body"), src / "docs.parquet", row_group_size=9)
    write_arrow(src / "stream.arrow", table(docs), file_format=False)
    write_arrow(src / "file.arrow", table(docs), file_format=True)
    shards = tmp_path / "shards"
    (shards / "b").mkdir(parents=True)
    write_jsonl(shards / "a.jsonl", docs[:12])  # path order: a.jsonl, b/c.parquet, d.arrow
    pq.write_table(table(docs[12:30]), shards / "b" / "c.parquet")
    write_arrow(shards / "d.arrow", table(docs[30:]), file_format=False)
    (shards / "README.md").write_text("# a dataset card, not a shard\n")
    cases = {"parquet": dict(from_path=src / "docs.parquet", text_field="body"),
             "stream": dict(from_path=src / "stream.arrow"), "file": dict(from_path=src / "file.arrow"),
             "shards": dict(from_path=shards)}
    for name, kw in cases.items():
        m = prepare_corpus(name, tmp_path / "data", **kw, **KW)
        assert corpus_content(tmp_path / "data", name) == want, name
        assert m["cleaning"] == reference["cleaning"]
        source = m["sources"][0]
        assert source["records"] == 40 and source["docs"] == 38 and source["bad_records_skipped"] == 0
    assert prepare_corpus("parquet", tmp_path / "data", **cases["parquet"], **KW)["params"]["text_field"] == "body"
    assert m["sources"][0]["files"] == 3 and m["sources"][0]["format"] == "shards"
    assert leftovers(tmp_path / "data") == []


def test_datasets_save_to_disk_and_its_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    docs = texts()
    d = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs}),
                              "test": datasets.Dataset.from_dict({"text": docs[:5] + ["only in test " * 3]})})
    d.save_to_disk(str(tmp_path / "saved"))
    d["train"].save_to_disk(str(tmp_path / "one"))
    write_jsonl(tmp_path / "docs.jsonl", docs)
    prepare_corpus("ref", tmp_path / "data", from_path=tmp_path / "docs.jsonl", **KW)
    m = prepare_corpus("dict", tmp_path / "data", from_path=tmp_path / "saved", **KW)  # train, by default
    assert m["sources"][0]["split"] == "train" and m["sources"][0]["format"] == "save_to_disk"
    assert corpus_content(tmp_path / "data", "dict") == corpus_content(tmp_path / "data", "ref")
    prepare_corpus("one", tmp_path / "data", from_path=tmp_path / "one", **KW)
    assert corpus_content(tmp_path / "data", "one") == corpus_content(tmp_path / "data", "ref")
    test = prepare_corpus("test", tmp_path / "data", from_path=tmp_path / "saved", split="test", **KW)
    assert test["params"]["split"] == "test" and test["cleaning"]["docs_read"] == 6
    c = open_corpus("test", tmp_path / "data")
    assert "only in test " * 3 in sum((split_texts(c, s) for s in ("train", "val", "test")), [])
    with pytest.raises(DataError, match=r"has no split 'validation'; its splits: train, test"):
        prepare_corpus("x", tmp_path / "data", from_path=tmp_path / "saved", split="validation", **KW)
    with pytest.raises(DataError, match=r"is a saved Dataset of one split; --split applies to"):
        prepare_corpus("x", tmp_path / "data", from_path=tmp_path / "one", split="train", **KW)
    d2 = datasets.DatasetDict({"a": d["train"], "b": d["test"]})
    d2.save_to_disk(str(tmp_path / "ab"))
    with pytest.raises(DataError, match=r"has the splits a, b; choose one with --split"):
        prepare_corpus("x", tmp_path / "data", from_path=tmp_path / "ab", **KW)


def test_a_folder_of_shards_by_split(tmp_path):
    docs = texts()
    hub = tmp_path / "hub" / "data"
    hub.mkdir(parents=True)
    pq.write_table(table(docs[:20]), hub / "train-00000-of-00002.parquet")
    pq.write_table(table(docs[20:]), hub / "train-00001-of-00002.parquet")
    pq.write_table(table(["a test document " * 5, "another one " * 4, "a third " * 6]), hub / "test-00000-of-00001.parquet")
    train = prepare_corpus("train", tmp_path / "data", from_path=tmp_path / "hub", split="train", **KW)
    assert train["sources"][0]["files"] == 2 and train["cleaning"]["docs_read"] == 40
    # Without --split, a folder naming several splits is read as a DatasetDict is: its train split.
    default = prepare_corpus("default", tmp_path / "data", from_path=tmp_path / "hub", **KW)
    assert default["sources"][0]["files"] == 2 and default["cleaning"]["docs_read"] == 40
    assert default["sources"][0]["split"] == "train" and default["sources"][0]["other_splits"] == ["test"]
    assert open_corpus("default", tmp_path / "data").fingerprint() == open_corpus("train", tmp_path / "data").fingerprint()
    test = prepare_corpus("test", tmp_path / "data", from_path=tmp_path / "hub", split="test", vocab_size=300,
                          progress=False, val_frac=0, test_frac=0)
    assert test["sources"][0]["files"] == 1 and test["cleaning"]["docs_read"] == 3
    with pytest.raises(DataError, match=r"no shard of .* belongs to split 'validation'"):
        prepare_corpus("x", tmp_path / "data", from_path=tmp_path / "hub", split="validation", **KW)
    (hub / "notes.txt").write_text("a text file among the shards\n")
    with pytest.raises(DataError, match=r"holds data shards \(3 parquet, arrow or JSONL files\) and 1 other file "
                                        r"\(data/notes.txt, ...\)"):
        prepare_corpus("x", tmp_path / "data", from_path=tmp_path / "hub", **KW)


def test_bad_records_are_one_line_errors_naming_the_record(tmp_path):
    docs: list = texts()
    docs[5], docs[11] = None, None
    pq.write_table(table(docs), tmp_path / "nulls.parquet", row_group_size=4)
    with pytest.raises(DataError) as e:
        prepare_corpus("x", tmp_path / "data", from_path=tmp_path / "nulls.parquet", **KW)
    assert str(e.value) == (f"{tmp_path / 'nulls.parquet'} row 5: \"text\" is null, not a string; fix or remove that "
                            "record, or pass --skip-bad-records to leave such records out")
    m = prepare_corpus("x", tmp_path / "data", from_path=tmp_path / "nulls.parquet", skip_bad_records=True, **KW)
    source = m["sources"][0]
    assert source["bad_records_skipped"] == 2 and source["records"] == 38
    assert source["bad_records"] == [f"{tmp_path / 'nulls.parquet'} row 5", f"{tmp_path / 'nulls.parquet'} row 11"]
    c = open_corpus("x", tmp_path / "data")
    assert not any("None" in t for s in ("train", "val", "test") for t in split_texts(c, s))
    assert m["cleaning"]["docs_read"] == 38
    from lenx.report.corpus_summary import skipped_records

    nulls = tmp_path / "nulls.parquet"
    assert skipped_records(m) == [f"skipped 2 bad records of {nulls} (--skip-bad-records; {nulls} row 5, {nulls} row 11)"]

    pq.write_table(pa.table({"text": list(range(40))}), tmp_path / "numbers.parquet")
    with pytest.raises(DataError, match=r"numbers.parquet row 0: \"text\" is int64, not a string \(the whole column "
                                        r"is int64\); name the text column with --text-field"):
        prepare_corpus("y", tmp_path / "data", from_path=tmp_path / "numbers.parquet", **KW)
    with pytest.raises(DataError, match=r"nulls.parquet has no column \"body\" \(its columns: id, text\); name the "
                                        r"text column with --text-field"):
        prepare_corpus("y", tmp_path / "data", from_path=tmp_path / "nulls.parquet", text_field="body", **KW)
    lines = [json.dumps({"body": "fine " * 9}), json.dumps({"body": ["a", "list"]}), json.dumps({"text": "x"})]
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl line 2: \"body\" is a list \(\[\"a\", \"list\"\]\), not a string"):
        prepare_corpus("y", tmp_path / "data", from_path=tmp_path / "bad.jsonl", text_field="body", **KW)
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "bad.jsonl").write_text(lines[0] + "\n\n" + lines[2] + "\n")  # a blank line is no record
    with pytest.raises(DataError, match=r"shards/bad.jsonl line 3: has no \"body\" field; fix or remove that record"):
        prepare_corpus("y", tmp_path / "data", from_path=shards, text_field="body", skip_bad_records=False, **KW)
    assert not (tmp_path / "data" / "y").exists() and leftovers(tmp_path / "data") == []


def test_arguments_that_do_not_fit_the_input(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("a document\n")
    write_jsonl(tmp_path / "docs.jsonl", texts())
    with pytest.raises(DataError, match=r"is a folder of text files \(one document each, no records\); --text-field"):
        open_user_data(folder, text_field="body")
    with pytest.raises(DataError, match=r"--split applies to a dataset with splits"):
        open_user_data(tmp_path / "docs.jsonl", split="train")
    with pytest.raises(DataError, match=r"is not a format lenx reads"):
        (tmp_path / "data.csv").write_text("text\nhello\n")
        open_user_data(tmp_path / "data.csv")
    with pytest.raises(DataError, match=r"does not exist; give a folder of text files, a JSONL, parquet or arrow"):
        open_user_data(tmp_path / "nope.parquet")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"cannot read .*broken.parquet as parquet"):
        open_user_data(tmp_path / "broken.parquet")
    with pytest.raises(DataError, match=r"apply to your own data given with --from"):
        prepare_corpus("books", tmp_path / "data", text_field="body")


def test_a_source_that_changes_between_passes_is_an_error(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "docs.jsonl", texts())
    from lenx.data.build import tokenizing

    real = tokenizing.train_bpe

    def edit_then_train(texts_, *args, **kw):  # the user rewrites the file after the first pass
        write_jsonl(path, [t + " more" for t in texts()])
        return real(texts_, *args, **kw)

    monkeypatch.setattr(tokenizing, "train_bpe", edit_then_train)
    with pytest.raises(DataError, match=r"docs.jsonl changed while lenx was building from it .*run it again"):
        prepare_corpus("x", tmp_path / "data", from_path=path, **KW)
    assert leftovers(tmp_path / "data") == [] and not (tmp_path / "data" / "x").exists()


def lenx(*args, cwd, env=None):
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


def test_a_dataset_in_the_hugging_face_cache_offline(tmp_path):
    """hf:NAME reads a dataset from the `datasets` cache (put there by loading a local folder with the
    cache in tmp_path), with the network off; a name not in the cache is a one-line error."""
    pytest.importorskip("datasets")
    hf = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1"}  # lenx goes offline itself
    repo = tmp_path / "lenxtiny" / "data"
    repo.mkdir(parents=True)
    pq.write_table(table(texts()), repo / "train-00000-of-00001.parquet")
    pq.write_table(table(["held out " * 8, "also held out " * 5, "third " * 9]), repo / "test-00000-of-00001.parquet")
    fill = subprocess.run([sys.executable, "-c", "import datasets; datasets.load_dataset('lenxtiny')"], cwd=tmp_path,
                          env={**os.environ, **hf, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert fill.returncode == 0, fill.stderr
    work = tmp_path / "work"
    work.mkdir()
    out = lenx("prepare", "tiny", "--from", "hf:lenxtiny", "--vocab-size", "300", "--no-progress", cwd=work, env=hf)
    assert out.returncode == 0, out.stderr
    m = json.loads((work / "data" / "tiny" / "manifest.json").read_text())  # stdout: a summary
    assert m["cleaning"]["docs_read"] == 40 and m["params"]["from_path"] == "hf:lenxtiny"
    write_jsonl(tmp_path / "docs.jsonl", texts())
    prepare_corpus("ref", work / "data", from_path=tmp_path / "docs.jsonl", **KW)
    assert corpus_content(work / "data", "tiny") == corpus_content(work / "data", "ref")
    out = lenx("prepare", "held", "--from", "hf:lenxtiny", "--split", "test", "--vocab-size", "300", "--no-progress",
               cwd=work, env=hf)
    assert out.returncode == 0, out.stderr
    assert json.loads((work / "data" / "held" / "manifest.json").read_text())["cleaning"]["docs_read"] == 3
    out = lenx("prepare", "gone", "--from", "hf:nobody/nothing", cwd=work, env=hf)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "error: --from hf:nobody/nothing: nobody/nothing is not in the Hugging Face datasets cache" in out.stderr


def test_without_the_hf_extra_a_one_line_error_says_how_to_install(tmp_path, monkeypatch):
    pq.write_table(table(texts()), tmp_path / "docs.parquet")
    write_arrow(tmp_path / "docs.arrow", table(texts()), file_format=False)
    write_jsonl(tmp_path / "docs.jsonl", texts())
    monkeypatch.setitem(sys.modules, "datasets", None)  # an import of it fails, as when it is not installed
    with pytest.raises(DataError, match=r"^reading a dataset from the Hugging Face cache needs datasets: "
                                        r"pip install 'lenx\[hf\]'$"):
        open_user_data("hf:somebody/something")
    for name in ("pyarrow", "pyarrow.parquet", "pyarrow.ipc"):
        monkeypatch.setitem(sys.modules, name, None)
    for path in (tmp_path / "docs.parquet", tmp_path / "docs.arrow"):
        with pytest.raises(DataError, match=r"^reading parquet, arrow or Hugging Face datasets needs pyarrow: "
                                            r"pip install 'lenx\[hf\]'$"):
            open_user_data(path)
    assert open_user_data(tmp_path / "docs.jsonl").record["name"] == "user"  # JSONL needs neither
