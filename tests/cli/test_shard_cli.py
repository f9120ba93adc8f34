"""`lenx shard` as a user runs it: relative paths from the folder that holds data/, the sentence
and the JSON it prints, --check after a copy went wrong, --join back to train.bin. Its one-line
errors are in test_cli_errors.py."""

import json
import os
from pathlib import Path
import shutil
import subprocess
import sys

import pytest

from lenx.data.build import prepare_corpus

SRC = Path(__file__).resolve().parents[2] / "src"
TEXTS = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "texts"


def lenx(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


@pytest.fixture
def workdir(tmp_path):
    prepare_corpus("mine", tmp_path / "data", from_path=TEXTS, vocab_size=400, progress=False, val_frac=0.1,
                   test_frac=0.1)
    return tmp_path


def test_shard_check_and_join_from_the_command_line(workdir):
    train_bin = (workdir / "data" / "mine" / "train.bin").read_bytes()
    out = lenx("shard", "mine", "--size", "200", "--remove-bin", cwd=workdir)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ("corpus mine: train split (663 tokens) in 4 shards of up to 200 tokens (0.0 MB) in "
                          "data/mine/train.shards\n")
    assert not (workdir / "data" / "mine" / "train.bin").exists()

    folder = workdir / "data" / "mine" / "train.shards"
    (folder / "00001.bin").unlink()  # a copy that did not arrive, one that arrived damaged
    shutil.copy(folder / "00000.bin", folder / "00002.bin")
    check = lenx("shard", "mine", "--check", "--json", cwd=workdir)
    assert check.returncode == 1, check.stderr
    states = {r["file"]: r["state"] for r in json.loads(check.stdout)["shards"]}
    assert states == {"00000.bin": "ok", "00001.bin": "missing", "00002.bin": "damaged", "00003.bin": "ok"}
    refused = lenx("shard", "mine", "--join", cwd=workdir)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "00001.bin" in refused.stderr

    shutil.rmtree(workdir / "data")  # from the top: shard, keep train.bin, --check, --join
    prepare_corpus("mine", workdir / "data", from_path=TEXTS, vocab_size=400, progress=False, val_frac=0.1,
                   test_frac=0.1)
    sharded = lenx("shard", "mine", "--size", "1KB", "--json", cwd=workdir)
    assert sharded.returncode == 0, sharded.stderr
    entry = json.loads(sharded.stdout)
    assert entry["tokens_per_shard"] == 500 and entry["train_bin_kept"] and len(entry["shards"]) == 2
    check = lenx("shard", "mine", "--check", cwd=workdir)
    assert check.returncode == 0 and check.stdout.endswith(": 2 here and intact\n"), check.stdout
    joined = lenx("shard", "mine", "--join", cwd=workdir)
    assert joined.returncode == 0 and "2 train shards joined" in joined.stdout, joined.stderr
    assert (workdir / "data" / "mine" / "train.bin").read_bytes() == train_bin and not folder.exists()


def test_shard_help_says_how_big_a_shard_travels():
    out = lenx("shard", "--help", cwd=SRC.parent)
    assert out.returncode == 0 and "xz -6" in out.stdout and "--join" in out.stdout and "--check" in out.stdout
