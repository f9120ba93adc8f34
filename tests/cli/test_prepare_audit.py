"""The newcomer audit of 2026-11-28 on `lenx prepare` and `lenx shard`, run as a user runs them: a
subprocess in a scratch folder, relative paths. Each test fails without its fix (F1-F7, S5, section 3)."""

import json
import os
from pathlib import Path
import subprocess
import sys

import pytest

import lenx

SRC = str(Path(lenx.__file__).resolve().parents[1])


def lenx_cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "lenx", *args, "--no-progress"] if args[0] == "prepare"
                          else [sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


def one_line_error(out, *needles):
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def records(n, tag="r"):
    return [json.dumps({"text": " ".join(f"{tag}{i} word{j % 50} item{j}" for j in range(150))}) for i in range(n)]


@pytest.fixture
def here(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("\n".join(records(40)) + "\n")
    return tmp_path


def prepare(here, name, source, *extra):
    return lenx_cli("prepare", name, "--from", source, "--vocab-size", "300", *extra, cwd=here)


def test_a_changed_input_is_refused_and_an_unchanged_one_is_said_to_be_reused(here):
    assert prepare(here, "mine", "in/a.jsonl").returncode == 0
    train_bin = (here / "data" / "mine" / "train.bin").read_bytes()
    again = prepare(here, "mine", "in/a.jsonl")
    assert again.returncode == 0 and "already prepared from in/a.jsonl" in again.stdout and "reused" in again.stdout
    (here / "in" / "a.jsonl").write_text("\n".join(records(20)) + "\n")  # edited: fewer records
    one_line_error(prepare(here, "mine", "in/a.jsonl"), "in/a.jsonl", "changed", "--force")
    assert (here / "data" / "mine" / "train.bin").read_bytes() == train_bin, "the corpus changed"
    rebuilt = prepare(here, "mine", "in/a.jsonl", "--force")
    assert rebuilt.returncode == 0 and (here / "data" / "mine" / "train.bin").read_bytes() != train_bin


def test_bytes_that_are_not_utf8_are_kept_and_counted_in_jsonl_and_in_a_text_folder(here):
    latin = 'caf\xe9 cr\xe8me br\xfbl\xe9e '.encode("latin-1") + b"and some more words " * 50
    with open(here / "in" / "lat.jsonl", "wb") as f:
        f.write(b'{"text": "' + latin + b'"}\n' + (here / "in" / "a.jsonl").read_bytes())
    out = prepare(here, "lat", "in/lat.jsonl")
    assert out.returncode == 0 and "not UTF-8" in out.stderr, out.stderr
    manifest = json.loads((here / "data" / "lat" / "manifest.json").read_text())
    assert '"not_utf8_kept_with_replacements": 1' in json.dumps(manifest)
    texts = here / "texts"
    texts.mkdir()
    for i, line in enumerate(records(12)):
        (texts / f"f{i}.txt").write_text(json.loads(line)["text"] + "\n")
    (texts / "latin.txt").write_bytes(latin)
    out = prepare(here, "tx", "texts")
    assert out.returncode == 0 and "not UTF-8" in out.stderr, out.stderr
    manifest = json.dumps(json.loads((here / "data" / "tx" / "manifest.json").read_text()))
    assert '"not_utf8_kept_with_replacements": 1' in manifest and '"files_skipped_not_text": 0' in manifest


def test_records_all_skipped_as_bad_say_so(here):
    line = one_line_error(prepare(here, "nof", "in/a.jsonl", "--text-field", "body", "--skip-bad-records"),
                          "all 40 records", 'no "body" field')
    assert "duplicates" not in line


def test_synthetic_refuses_a_tokenizer_or_a_vocabulary(here):
    for extra in (["--vocab-size", "512"], ["--tokenizer", "gpt2"]):
        one_line_error(lenx_cli("prepare", "synthetic", *extra, cwd=here), "synthetic")
    assert not (here / "data").exists()


def test_a_document_with_a_huge_unbroken_stretch_is_refused_before_anything_is_written(here):
    (here / "in" / "run.jsonl").write_text(json.dumps({"text": "a" * 1_000_001}) + "\n"
                                           + (here / "in" / "a.jsonl").read_text())
    one_line_error(prepare(here, "run", "in/run.jsonl"), "run.jsonl:1", "1,000,001 characters without a space")
    assert not (here / "data" / "run").exists()


def peak_of_prepare(here, name, source) -> int:
    """Peak resident bytes of `lenx prepare` run by a fresh Python whose only child it is."""
    code = ("import resource, subprocess, sys\n"
            "out = subprocess.run([sys.executable, '-m', 'lenx', 'prepare', *sys.argv[1:]], capture_output=True)\n"
            "assert out.returncode == 0, out.stderr.decode()[-2000:]\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)")
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-c", code, name, "--from", source, "--vocab-size", "300", "--no-progress"],
                         capture_output=True, text=True, timeout=900, cwd=here, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in KB is Linux's")
def test_one_long_document_does_not_grow_memory_with_its_length(here):
    """The audit's 56 MB document took 10.1 GB (about 180 bytes a character); one of 6 M characters
    now costs about what the rest of the corpus does, well under a byte a character more."""
    words = " ".join(f"w{j % 997}x{j % 13}" for j in range(1_000_000))  # ~6.4 M characters
    (here / "in" / "long.jsonl").write_text(json.dumps({"text": words}) + "\n" + (here / "in" / "a.jsonl").read_text())
    small = peak_of_prepare(here, "small", "in/a.jsonl")
    long = peak_of_prepare(here, "long", "in/long.jsonl")
    assert long - small < len(words) * 60, (small, long)  # the old code: ~180 bytes a character


def test_shard_refuses_tiny_shards_and_names_an_unknown_corpus(here):
    assert prepare(here, "mine", "in/a.jsonl").returncode == 0
    before = sorted(p.name for p in (here / "data" / "mine").iterdir())
    one_line_error(lenx_cli("shard", "mine", "--size", "1", cwd=here), "at most 1,000", "--size")
    assert sorted(p.name for p in (here / "data" / "mine").iterdir()) == before
    (here / "empty").mkdir()
    one_line_error(lenx_cli("shard", "mine", "--root", "empty", cwd=here), "unknown corpus 'mine'")
