"""The windows each step reads (lenx.training.batches): random draws exactly as before, one pass
that reads every window at most once in blocks of the stream, the checks before a run starts (a
pass too short, absent shards), meta.json's sampling and epochs, and a run that moves between
machines holding different shards resuming exactly."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
import shutil
import subprocess
import sys

import numpy as np
import pytest

import lenx
from lenx.config import ConfigError, load_config
from lenx.data import open_corpus
from lenx.data.build import prepare_corpus
from lenx.data.sharding import shard_corpus
from lenx.training.batches import Batches, PassOrder, needed_shards, sampling_record, train_batches
from lenx.training.distributed import DistInfo
from lenx.training.loop import train

SRC = str(Path(lenx.__file__).resolve().parents[1])
REPO = Path(__file__).resolve().parents[2]
# 2048 tokens a step, one step a block: a 10,000-token shard holds about five steps
TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=64", "train.batch_size=32",
        "train.log_every=1", "train.device=cpu", "train.sampling='pass'", "train.pass_block=1", "train.ckpt_every=100"]


def stream(n=5000):
    return np.random.default_rng(7).integers(0, 1000, n).astype(np.uint16)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    prepare_corpus("synthetic", root, progress=False)
    return root


@pytest.fixture
def sharded(synthetic, tmp_path):
    """A copy of the synthetic corpus (2,006,940 train tokens) in 10,000-token shards, without train.bin."""
    shutil.copytree(synthetic / "synthetic", tmp_path / "data" / "synthetic")
    shard_corpus("synthetic", tmp_path / "data", "10K", remove_bin=True)
    return tmp_path / "data"


def cfg_for(root, *extra):
    return load_config("tiny", TINY + [f"data.root={str(root)!r}", *extra])


# --- random sampling: unchanged ------------------------------------------------------------------

def test_random_draws_are_those_lenx_drew_before_pass_sampling_existed():
    """The digest of these batches was computed with Batches as it was in lenx.training.loop before
    train.sampling existed (main at d8b477f): random runs read exactly what they read then."""
    h = hashlib.sha256()
    for world in (1, 2):
        for rank in range(world):
            b = Batches(stream(), 16, 8, 2, 3, DistInfo(rank=rank, world=world, local_rank=rank))
            for step in range(10):
                for micro in range(2):
                    h.update(b.window(step, micro).numpy().tobytes())
    assert h.hexdigest() == "a6c2dcbf73bfdb0222924b4b920657cff95047ae91256c00a5b26d2cde78a31e"


def test_random_draws_read_the_same_from_shards(synthetic, sharded):
    whole = open_corpus("synthetic", synthetic).tokens("train")
    view = open_corpus("synthetic", sharded).tokens("train")
    a, b = (Batches(t, 64, 32, 1, 5, DistInfo()) for t in (whole, view))
    for step in range(20):
        assert np.array_equal(a.window(step, 0), b.window(step, 0))


# --- one pass ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, T, batch, block", [(5000, 16, 8, 3), (4097, 16, 8, 1), (3001, 7, 6, 50), (40, 3, 2, 1)])
def test_a_pass_reads_every_window_at_most_once_and_steps_read_their_blocks(n, T, batch, block):
    order = PassOrder(n, T, batch, block, seed=1)
    assert order.windows == (n - 1) // T and order.steps() == order.windows // batch
    starts = np.concatenate([order.starts(s) for s in range(order.steps())])
    assert len(starts) == len(set(starts.tolist())) == order.steps() * batch  # each window once, as many as planned
    assert (starts % T == 0).all() and starts.max() + T + 1 <= n
    if order.windows % batch == 0:
        assert sorted(starts.tolist()) == [w * T for w in range(order.windows)]  # the whole pass
    for a in range(order.steps()):
        for b in (a + 1, min(order.steps(), a + 4)):
            lo, hi = order.token_range(a, b)
            inside = np.concatenate([order.starts(s) for s in range(a, b)])
            assert lo <= inside.min() and inside.max() + T + 1 <= hi <= n
    # not in order: the batch of a step depends on (seed, step) alone
    again = PassOrder(n, T, batch, block, seed=1)
    for s in reversed(range(order.steps())):
        assert np.array_equal(again.starts(s), order.starts(s))
    other = PassOrder(n, T, batch, block, seed=2)  # another seed, another order
    assert any(not np.array_equal(other.starts(s), order.starts(s)) for s in range(order.steps()))
    with pytest.raises(IndexError):
        order.starts(order.steps())


def test_ranks_and_micro_batches_split_the_same_pass_batch():
    tokens = stream()
    one = Batches(tokens, 16, 8, 1, 4, DistInfo(), sampling="pass", pass_block=2)
    for step in range(5):
        whole = one.window(step, 0)
        parts = [Batches(tokens, 16, 8, 2, 4, DistInfo(rank=r, world=2, local_rank=r), sampling="pass",
                         pass_block=2).window(step, m) for m in range(2) for r in range(2)]
        assert np.array_equal(np.concatenate(parts), whole)
        assert all(np.array_equal(row, tokens[s:s + 17]) for row, s in zip(whole.numpy(), one.starts(step)))


def test_sampling_and_pass_block_are_checked():
    with pytest.raises(ConfigError, match="train.sampling must be one of random, pass"):
        load_config("tiny", ["train.sampling='once'"])
    with pytest.raises(ConfigError, match="train.pass_block must be >= 1"):
        load_config("tiny", ["train.pass_block=0"])


def test_a_pass_too_short_for_the_run_is_a_one_line_error(synthetic):
    corpus = open_corpus("synthetic", synthetic)
    windows = (len(corpus.tokens("train")) - 1) // 64
    ok = cfg_for(synthetic, f"train.steps={windows // 32}")
    train_batches(ok.train, corpus, DistInfo(), 0, ok.train.steps)
    over = cfg_for(synthetic, f"train.steps={windows // 32 + 1}")
    with pytest.raises(ConfigError) as e:
        train_batches(over.train, corpus, DistInfo(), 0, 1)
    assert "\n" not in str(e.value) and f"{windows:,} windows of 65 tokens" in str(e.value)
    assert f"{windows // 32:,} steps of train.batch_size 32, fewer than train.steps {windows // 32 + 1:,}" in str(e.value)
    random = cfg_for(synthetic, f"train.steps={windows}", "train.sampling='random'")  # draws with replacement: no limit
    train_batches(random.train, corpus, DistInfo(), 0, random.train.steps)


def test_absent_shards_are_named_before_the_run_starts(sharded):
    cfg = cfg_for(sharded, "train.steps=40")
    corpus = open_corpus("synthetic", sharded)
    need = needed_shards(cfg.train, corpus, 10, 20)
    assert need == list(corpus.tokens("train").covering(10 * 2048, 20 * 2048 + 1)) == [2, 3, 4]
    (sharded / "synthetic" / "train.shards" / "00003.bin").unlink()
    train_batches(cfg.train, corpus, DistInfo(), 0, 14)  # steps 0-13 end at token 28673, before shard 3
    with pytest.raises(ConfigError) as e:
        train_batches(cfg.train, corpus, DistInfo(), 10, 20)
    msg = str(e.value)
    assert "\n" not in msg and "steps 10:20" in msg and "train shards 2-4" in msg and "1 of them is not here" in msg
    assert "00003.bin" in msg and msg.endswith("--until 14")  # steps 10-13 need no absent shard, step 14 does
    with pytest.raises(ConfigError, match="shards 3-4.*00003.bin.*RUN --steps 15:20 lists them\\)$"):
        train_batches(cfg.train, corpus, DistInfo(), 15, 20)  # nothing to train here: no --until
    random = cfg_for(sharded, "train.steps=40", "train.sampling='random'")
    assert needed_shards(random.train, corpus, 0, 1) == list(range(201))
    with pytest.raises(ConfigError, match=r"needs all 201 train shards of corpus 'synthetic'; 1 of them is not here.*"
                                          r"00003\.bin.*train\.sampling=\"pass\"$"):
        train_batches(random.train, corpus, DistInfo(), 0, 1)


def test_epochs_are_exact_for_a_pass_and_expected_for_random_draws(synthetic):
    corpus = open_corpus("synthetic", synthetic)
    n = corpus.manifest["splits"]["train"]["tokens"]
    one = sampling_record(cfg_for(synthetic, "train.steps=100").train, corpus)
    assert one == {"sampling": "pass", "epochs": round(100 * 32 * 64 / n, 6), "train_tokens": n,
                   "epochs_are": "exact: each window of one pass read once", "documents": "stream"}
    drawn = sampling_record(cfg_for(synthetic, "train.steps=2000", "train.sampling='random'").train, corpus)
    assert drawn["epochs"] == round(2000 * 32 * 64 / n, 6) > 2 and drawn["epochs_are"].startswith("expected")


# --- a run across machines -----------------------------------------------------------------------

def hide(root: Path, keep: list[int]) -> None:
    """This machine holds only the shards `keep` (the others are moved aside, as if never copied)."""
    folder, aside = root / "synthetic" / "train.shards", root / "aside"
    aside.mkdir(exist_ok=True)
    for p in list(folder.iterdir()) + list(aside.iterdir()):
        target = folder if int(p.stem) in keep else aside
        if p.parent != target:
            p.rename(target / p.name)


def curve(run_dir):
    return [json.loads(line)["loss"] for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_a_pass_run_moves_between_machines_with_the_shards_of_its_steps(sharded, tmp_path):
    cfg = cfg_for(sharded, "train.steps=8")
    full = train(cfg, tmp_path / "full", progress=False)
    assert full["finished"] and full["sampling"] == "pass"
    corpus = open_corpus("synthetic", sharded)
    first, second = needed_shards(cfg.train, corpus, 0, 4), needed_shards(cfg.train, corpus, 4, 8)
    assert first == [0] and second == [0, 1]  # steps 4-7 read tokens 8,192-16,385

    hide(sharded, first)  # machine one: the first shard only
    with pytest.raises(ConfigError, match="steps 0:8 .* 00001.bin .*--until 4$"):
        train(cfg, tmp_path / "moved", progress=False)
    assert not (tmp_path / "moved").exists()  # refused before anything was written
    part = train(cfg, tmp_path / "moved", progress=False, until=4)
    assert part["step"] == 4 and not part["finished"]
    hide(sharded, second)  # machine two: the shards of steps 4-7
    with pytest.raises(ConfigError, match="--until 3: .* is at step 4 already"):
        train(None, tmp_path / "moved", resume=True, progress=False, until=3)
    done = train(None, tmp_path / "moved", resume=True, progress=False)
    assert done["finished"] and done["final_loss"] == full["final_loss"]
    assert curve(tmp_path / "moved") == curve(tmp_path / "full")
    meta = json.loads((tmp_path / "moved" / "meta.json").read_text())
    n = corpus.manifest["splits"]["train"]["tokens"]
    assert meta["sampling"] == "pass" and meta["epochs"] == round(8 * 32 * 64 / n, 6) == done["epochs"]
    assert meta["train_tokens"] == n and meta["corpus"] == "synthetic"
    assert meta["corpus_fingerprint"] == open_corpus("synthetic", sharded).fingerprint()


def run_lenx(*args, cwd):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


def test_the_cli_refuses_a_run_its_data_cannot_feed_in_one_line_before_any_work(sharded, tmp_path):
    """As a user runs it: relative paths from the folder that holds data/."""
    sets = [a for o in TINY for a in ("--set", o)] + ["--set", "data.root='data'"]
    hide(sharded, [0, 1])
    absent = run_lenx("train", "-c", "tiny", *sets, "--set", "train.steps=12", "-o", "runs/a", cwd=tmp_path)
    assert absent.returncode == 2 and absent.stderr.count("\n") == 1, absent.stderr
    assert "00002.bin" in absent.stderr and absent.stderr.endswith("--until 9\n")  # steps 0-8 end before token 20,000
    too_many = run_lenx("train", "-c", "tiny", *sets, "--set", "train.steps=1000", "-o", "runs/b", cwd=tmp_path)
    assert too_many.returncode == 2 and too_many.stderr.count("\n") == 1, too_many.stderr
    assert "fewer than train.steps 1,000" in too_many.stderr
    assert not (tmp_path / "runs").exists()


def test_shards_for_steps_lists_what_a_machine_needs(sharded, tmp_path):
    script = REPO / "scripts" / "data" / "shards_for_steps.py"
    env = {**os.environ, "PYTHONPATH": SRC}
    sets = [a for o in TINY + ["data.root='data'", "train.steps=8"] for a in ("--set", o)]
    out = subprocess.run([sys.executable, str(script), "tiny", *sets, "--steps", "4:8"], capture_output=True,
                         text=True, cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["data/synthetic/train.shards/00000.bin", "data/synthetic/train.shards/00001.bin"]
    every = subprocess.run([sys.executable, str(script), "tiny", *sets, "--all-files", "--json"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    listed = json.loads(every.stdout)
    assert listed["steps"] == [0, 8] and [s["file"] for s in listed["shards"]] == ["00000.bin", "00001.bin"]
    assert "data/synthetic/manifest.json" in listed["other_files"] and len(listed["other_files"]) == 6
    bad = subprocess.run([sys.executable, str(script), "tiny", *sets, "--steps", "4:9"], capture_output=True,
                         text=True, cwd=tmp_path, env=env, timeout=300)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "train.steps" in bad.stderr
