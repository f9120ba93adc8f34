"""scripts/data/pack_corpus.py: a prepared corpus packed into pieces, joined and unpacked elsewhere
byte for byte, as a user runs it (a subprocess, relative paths, another working directory); a
missing or damaged piece is a one-line error before anything is written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lenx.data import open_corpus
from lenx.data.layout import fingerprint_files

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "data" / "pack_corpus.py"


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture
def packed(folder_corpus, tmp_path):
    """The fixture corpus copied to here/data/mine and packed into here/.carry/mine in pieces of 1 KiB."""
    root, _ = folder_corpus
    here = tmp_path / "here"
    shutil.copytree(root / "mine", here / "data" / "mine")
    out = run(here, "pack", "data/mine", ".carry/mine", "--piece-mib", str(1 / 1024), "--preset", "1")
    assert out.returncode == 0, out.stderr
    return here, out.stdout


def test_a_corpus_round_trips_through_pieces(packed, tmp_path):
    here, stdout = packed
    record = json.loads((here / ".carry" / "mine" / "pack.json").read_text())
    pieces = record["pieces"]
    assert len(pieces) >= 3 and {p["bytes"] for p in pieces[:-1]} == {1024} and 0 < pieces[-1]["bytes"] <= 1024
    names = sorted(p.name for p in (here / "data" / "mine").iterdir())
    assert [f["name"] for f in record["files"]] == names  # every file of the corpus, manifest.json included
    assert f"-> {len(pieces)} pieces" in stdout and record["corpus"] == "mine"
    assert f"call {len(pieces)}: carry .carry/mine/{pieces[-1]['name']} and .carry/mine/pack.json" in stdout
    assert "then, there: python scripts/data/pack_corpus.py unpack .carry/mine data/mine" in stdout
    # carried elsewhere: only the pieces and pack.json travel
    there = tmp_path / "there"
    shutil.copytree(here / ".carry", there / ".carry")
    out = run(there, "unpack", ".carry/mine", "data/mine")
    assert out.returncode == 0 and "unpacked and verified" in out.stdout, out.stderr
    for name in names:
        assert (there / "data" / "mine" / name).read_bytes() == (here / "data" / "mine" / name).read_bytes(), name
    assert sorted(p.name for p in (there / "data").iterdir()) == ["mine"]  # no hidden folder left
    c = open_corpus("mine", there / "data")
    assert fingerprint_files(there / "data" / "mine", True) == c.manifest["fingerprint"]
    # again: the corpus is there, so only with --force
    out = run(there, "unpack", ".carry/mine", "data/mine")
    assert out.returncode == 2 and out.stderr == "error: data/mine exists; pass --force to replace it\n"
    assert run(there, "unpack", ".carry/mine", "data/mine", "--force").returncode == 0


def test_missing_or_damaged_pieces_are_named_before_anything_is_written(packed):
    here, _ = packed
    carry = here / ".carry" / "mine"
    pieces = json.loads((carry / "pack.json").read_text())["pieces"]
    (carry / pieces[1]["name"]).unlink()
    damaged = carry / pieces[2]["name"]
    damaged.write_bytes(b"x" + damaged.read_bytes()[1:])
    out = run(here, "unpack", ".carry/mine", "elsewhere")
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
    assert (f"2 of {len(pieces)} pieces are not ready in .carry/mine: {pieces[1]['name']} is missing; "
            f"{pieces[2]['name']} is damaged (sha256 differs)") in out.stderr
    assert not (here / "elsewhere").exists() and not any(p.name.startswith(".elsewhere") for p in here.iterdir())
    check = run(here, "unpack", ".carry/mine", "--check")
    assert check.returncode == 1 and check.stdout.startswith(f"{len(pieces) - 2} of {len(pieces)} pieces there")


def test_a_stream_that_does_not_match_pack_json_is_refused(packed):
    here, _ = packed
    carry = here / ".carry" / "mine"
    record = json.loads((carry / "pack.json").read_text())
    record["files"][-1]["sha256"] = "0" * 64  # pieces intact, a file's bytes not what pack.json says
    (carry / "pack.json").write_text(json.dumps(record))
    out = run(here, "unpack", ".carry/mine", "data/again")
    assert out.returncode == 2 and f"{record['files'][-1]['name']} unpacked to" in out.stderr
    assert not (here / "data" / "again").exists()
    assert sorted(p.name for p in (here / "data").iterdir()) == ["mine"]


@pytest.mark.parametrize("args, needle", [
    (["pack", "nothing", "out"], "nothing is not a prepared corpus (it has no manifest.json)"),
    (["pack", "data/mine", ".carry/mine"], ".carry/mine exists and is not an empty folder; give a new one"),
    (["pack", "data/mine", "new", "--piece-mib", "0"], "--piece-mib must be > 0, got 0.0"),
    (["unpack", "data", "x"], "data/pack.json is missing; carry it with the pieces"),
    (["unpack", ".carry/mine"], "unpack needs the corpus folder to write (dest), or --check"),
])
def test_bad_input_is_one_line(packed, args, needle):
    here, _ = packed
    out = run(here, *args)
    assert out.returncode == 2 and out.stderr == f"error: {needle}\n"


def test_help(tmp_path):
    for args in ([], ["pack"], ["unpack"]):
        out = run(tmp_path, *args, "--help")
        assert out.returncode == 0 and "usage:" in out.stdout
