"""A corpus's train split as shards (lenx.data.sharding, lenx.data.shards): the same stream read
back at every size, the fingerprint kept, train.bin removable, a killed `lenx shard` harmless, an
absent shard a one-line error, and joining back to the very train.bin."""

from __future__ import annotations

import json
import os
from pathlib import Path
import shutil
import subprocess
import sys

import numpy as np
import pytest

import lenx
from corpus_helpers import TEXTS
from lenx.data import DataError, open_corpus
from lenx.data.build import prepare_corpus
from lenx.data.layout import fingerprint_files
from lenx.data.sharding import check_shards, join_shards, parse_size, shard_corpus

SRC = str(Path(lenx.__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A small corpus of text files (663 train tokens), prepared once; each test shards a copy."""
    root = tmp_path_factory.mktemp("shards")
    prepare_corpus("mine", root, from_path=TEXTS, vocab_size=400, progress=False, val_frac=0.1, test_frac=0.1)
    return root


@pytest.fixture
def root(built, tmp_path):
    shutil.copytree(built / "mine", tmp_path / "mine")
    return tmp_path


def manifest(root: Path) -> dict:
    return json.loads((root / "mine" / "manifest.json").read_text())


@pytest.mark.parametrize("size", ["1", "7", "100", "662", "663", "5000"])
def test_every_window_reads_the_same_from_shards_and_joined_back(root, size):
    before = manifest(root)
    original = np.array(open_corpus("mine", root).tokens("train"))
    bin_bytes = (root / "mine" / "train.bin").read_bytes()
    entry = shard_corpus("mine", root, size, remove_bin=True)
    n, per = len(original), int(size)
    assert [f["tokens"] for f in entry["files"]] == [min(per, n - a) for a in range(0, n, per)]
    assert not (root / "mine" / "train.bin").exists()
    c = open_corpus("mine", root)
    view = c.tokens("train")
    assert len(view) == n and view.dtype == original.dtype and view.shape == (n,)
    assert c.fingerprint() == before["fingerprint"] == manifest(root)["fingerprint"]
    for T in (1, 5, 16):  # every window of every stride-T pass, and a window at every start
        for a in range(0, n - T, T):
            np.testing.assert_array_equal(view[a:a + T + 1], original[a:a + T + 1])
    for a in range(n):
        np.testing.assert_array_equal(view[a:a + 9], original[a:a + 9])
        assert view[a] == original[a] and view[a - n] == original[a - n]
    np.testing.assert_array_equal(view[:], original)
    np.testing.assert_array_equal(view[-10:n + 50], original[-10:])
    assert len(view[n:n + 5]) == 0 and len(view[7:3]) == 0
    with pytest.raises(IndexError):
        view[n]
    assert join_shards("mine", root) == len(entry["files"])
    assert (root / "mine" / "train.bin").read_bytes() == bin_bytes
    assert manifest(root) == before and not (root / "mine" / "train.shards").exists()
    assert not [p for p in (root / "mine").iterdir() if p.name.startswith(".")]


def test_a_sharded_corpus_keeps_train_bin_until_asked_and_prepare_still_counts_it_prepared(root):
    before = manifest(root)
    shard_corpus("mine", root, "200")
    assert (root / "mine" / "train.bin").is_file()  # kept: nothing the user had is gone
    after = manifest(root)
    assert {k: v for k, v in after.items() if k != "shards"} == before
    records = after["shards"]["train"]["files"]
    assert [r["file"] for r in records] == ["00000.bin", "00001.bin", "00002.bin", "00003.bin"]
    assert [r["start"] for r in records] == [0, 200, 400, 600]
    assert all(r["sha256"] and (root / "mine" / "train.shards" / r["file"]).stat().st_size == 2 * r["tokens"]
               for r in records)
    # preparing it again with the same settings finds it prepared, and leaves it sharded
    again = prepare_corpus("mine", root, from_path=TEXTS, vocab_size=400, progress=False, val_frac=0.1, test_frac=0.1)
    assert again["shards"] == after["shards"]
    # the same size again changes nothing; --remove-bin then drops train.bin, shards checked first
    assert shard_corpus("mine", root, "200") == after["shards"]["train"]
    shard_corpus("mine", root, "200", remove_bin=True)
    assert not (root / "mine" / "train.bin").exists() and manifest(root) == after
    with pytest.raises(DataError, match=r"sharded already, in 4 shards of 200 tokens.*lenx shard mine --join"):
        shard_corpus("mine", root, "300")


def test_an_absent_or_partial_shard_is_a_one_line_error_when_read(root):
    shard_corpus("mine", root, "200", remove_bin=True)
    folder = root / "mine" / "train.shards"
    (folder / "00002.bin").unlink()
    (folder / "00003.bin").write_bytes((folder / "00003.bin").read_bytes()[:10])
    view = open_corpus("mine", root).tokens("train")  # opening reads no shard
    assert len(view[0:400]) == 400 and len(view[150:250]) == 100
    with pytest.raises(DataError) as e:
        view[390:410]
    msg = str(e.value)
    assert "\n" not in msg and str(folder / "00002.bin") in msg and "is missing" in msg and "lenx shard mine" in msg
    with pytest.raises(DataError, match=r"00003\.bin of corpus 'mine' has 10 bytes, the manifest says 126"):
        view[600]
    assert view.unreadable() == [2, 3] and view.unreadable(0, 400) == [] and view.unreadable(399, 401) == [2]
    states = {r["file"]: why for r, why in check_shards(open_corpus("mine", root))}
    assert states["00000.bin"] is None and states["00002.bin"] == "is missing" and "10 bytes" in states["00003.bin"]
    with pytest.raises(DataError, match=r"cannot join corpus 'mine': 2 of its 4 train shards .*00002\.bin, 00003\.bin"):
        join_shards("mine", root)


def test_check_finds_a_shard_whose_bytes_changed(root):
    shard_corpus("mine", root, "300")
    path = root / "mine" / "train.shards" / "00001.bin"
    data = bytearray(path.read_bytes())
    data[3] ^= 1
    path.write_bytes(bytes(data))
    states = [why for _, why in check_shards(open_corpus("mine", root))]
    assert states == [None, "its sha256 differs from the manifest's", None]


def test_a_damaged_train_bin_is_refused_before_the_manifest_changes(root):
    path = root / "mine" / "train.bin"
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))
    before = manifest(root)
    with pytest.raises(DataError, match="does not match the manifest's fingerprint"):
        shard_corpus("mine", root, "100")
    assert manifest(root) == before and sorted(p.name for p in (root / "mine").iterdir()) == sorted(
        ["manifest.json", "tokenizer.json"] + [f"{s}.{x}" for s in ("train", "val", "test") for x in ("bin", "idx.npy")])


def test_a_corpus_from_before_fingerprints_gets_its_fingerprint_recorded(root):
    m = manifest(root)
    del m["fingerprint"]
    (root / "mine" / "manifest.json").write_text(json.dumps(m))
    shard_corpus("mine", root, "100", remove_bin=True)
    assert manifest(root)["fingerprint"] == open_corpus("mine", root).fingerprint()
    join_shards("mine", root)
    assert manifest(root)["fingerprint"] == fingerprint_files(root / "mine", True)


# A `lenx shard` killed (os._exit: no cleanup runs) at one of its stages.
KILLED = """
import os, sys
from lenx.data import sharding
stage = sys.argv[2]
if stage == "writing":  # after the first shard's bytes
    real = sharding._copy
    calls = []
    def copy(*args):
        real(*args)
        calls.append(1)
        if len(calls) == 2:
            os._exit(9)
    sharding._copy = copy
else:  # the shards moved into place, the manifest not yet written
    sharding.write_json = lambda *args: os._exit(9)
sharding.shard_corpus("mine", sys.argv[1], "100", remove_bin=True)
"""


@pytest.mark.parametrize("stage", ["writing", "recording"])
def test_a_killed_shard_command_leaves_the_corpus_usable(root, stage):
    before = manifest(root)
    original = np.array(open_corpus("mine", root).tokens("train"))
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-c", KILLED, str(root), stage], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 9, out.stderr
    left = sorted(p.name for p in (root / "mine").iterdir() if "shards" in p.name)
    if stage == "writing":
        assert len(left) == 1 and left[0].startswith(".train.shards.tmp-"), left
    else:
        assert left == ["train.shards"]
    c = open_corpus("mine", root)  # as it was: train.bin, no shards in the manifest
    assert manifest(root) == before and type(c.tokens("train")) is np.memmap
    np.testing.assert_array_equal(c.tokens("train"), original)
    shard_corpus("mine", root, "100")  # the next run tidies up after the killed one
    assert sorted(p.name for p in (root / "mine").iterdir() if "shards" in p.name) == ["train.shards"]
    np.testing.assert_array_equal(open_corpus("mine", root).tokens("train")[:], original)


@pytest.mark.parametrize("text, tokens", [("30M", 30_000_000), ("1500", 1500), ("2.5K", 2500), ("1g", 10 ** 9),
                                          ("40MiB", 20 * 2 ** 20), ("60MB", 30_000_000), ("3B", 1)])
def test_sizes_in_tokens_or_bytes(text, tokens):
    assert parse_size(text, 2) == tokens


@pytest.mark.parametrize("text", ["", "abc", "-3", "30T", "1B/2", "0"])
def test_bad_sizes_are_one_line_errors(text):
    with pytest.raises(DataError, match="--size"):
        parse_size(text, 4)
