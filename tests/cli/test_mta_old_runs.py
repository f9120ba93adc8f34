"""`mta` is MTA's released configuration (heads mixed before and after the softmax, the post-softmax
6 x 11 convolution). Runs saved before that lack the two keys in their config.toml and keep the
settings they trained with (lenx.config.FORMER_DEFAULTS): they load, evaluate, resume, export and
train again from their config.toml.
The CLI is driven as a user runs it (another working directory, relative paths)."""

import importlib.util
import json
import os
from pathlib import Path
import re
import subprocess
import sys

import pytest

from lenx.config import load_config
from lenx.runs import run_config
from lenx.training.sweep import _saved_config

SRC = Path(__file__).resolve().parents[2] / "src"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
TINY = ["--set", "model.n_layer=1", "--set", "model.d_model=32", "--set", "train.seq_len=32", "--set",
        "train.batch_size=4", "--set", "train.log_every=1", "--set", "eval.max_length=64", "--set", "eval.windows=2",
        "--set", "eval.scored=8", "--no-progress"]


def lenx(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600,
                         cwd=cwd, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def mta_keys(model) -> tuple:
    return model.mta_head_mix, model.mta_post_conv


def test_a_run_config_without_the_keys_reads_as_it_trained(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[model]\nmethod = "mta"\n')
    assert mta_keys(load_config(path, recorded=True).model) == ("post", False)  # a run's: the former defaults
    assert mta_keys(load_config(path).model) == ("both", True)  # a config a user wrote: today's
    assert mta_keys(load_config("tiny", ["model.method=mta"]).model) == ("both", True)
    path.write_text('[model]\nmethod = "mta"\nmta_head_mix = "pre"\nmta_post_conv = true\n')
    assert mta_keys(load_config(path, recorded=True).model) == ("pre", True)  # what a run wrote stands
    path.write_text('[model]\nmethod = "mta"\n')
    # a sweep compares a run it finds with the one it is asked for: an old `mta` run is not today's
    assert mta_keys(_saved_config(tmp_path).model) == ("post", False)


@pytest.mark.parametrize("run", ["rope", "kerple"])
def test_the_fixture_runs_still_load(run):
    cfg = run_config(FIXTURES / run)
    assert cfg.model.method == run and mta_keys(cfg.model) == ("post", False)


def test_an_export_without_the_keys_builds_the_model_it_was():
    pytest.importorskip("transformers")
    from lenx.export.hf import LenxConfig

    assert mta_keys(LenxConfig(lenx={"method": "mta"}).lm_config()) == ("post", False)
    assert mta_keys(LenxConfig(lenx={"method": "mta", "mta_head_mix": "both", "mta_post_conv": True})
                    .lm_config()) == ("both", True)


def test_old_and_new_mta_runs_train_evaluate_resume_and_export(tmp_path):
    """A new `mta` run records the released settings and evaluates; an `mta` run trained with the
    former defaults and saved before the keys existed (config.toml without them) evaluates, resumes
    and exports: its weights load strictly, so the model built for it must be the one it trained."""
    lenx("train", "-c", "tiny", "--set", "model.method=mta", "--set", "train.steps=2", "-o", "runs/new", *TINY,
         cwd=tmp_path)
    text = (tmp_path / "runs/new/config.toml").read_text()
    assert 'mta_head_mix = "both"' in text and "mta_post_conv = true" in text
    lenx("eval", "runs/new", cwd=tmp_path)
    ppl = [r["ppl"] for r in json.loads((tmp_path / "runs/new/eval.json").read_text())["results"].values()]
    assert ppl and all(0 < p < float("inf") for p in ppl)

    lenx("train", "-c", "tiny", "--set", "model.method=mta", "--set", "model.mta_head_mix=post", "--set",
         "model.mta_post_conv=false", "--set", "train.steps=2", "-o", "runs/old", *TINY, cwd=tmp_path)
    config = tmp_path / "runs/old/config.toml"
    text, n = re.subn(r"^mta_(head_mix|post_conv) = .*\n", "", config.read_text(), flags=re.M)
    assert n == 2
    config.write_text(text)
    # trained again from its config.toml (what lenx suggests when a run's weights are lost): as it was
    lenx("train", "-c", "runs/old/config.toml", "--set", "train.steps=1", "-o", "runs/again", "--no-progress",
         cwd=tmp_path)
    assert mta_keys(load_config(tmp_path / "runs/again/config.toml").model) == ("post", False)
    lenx("eval", "runs/old", cwd=tmp_path)
    assert json.loads((tmp_path / "runs/old/eval.json").read_text())["results"]
    if importlib.util.find_spec("transformers"):  # lenx's hf extra
        lenx("export", "runs/old", "exported", cwd=tmp_path)
        assert (tmp_path / "exported" / "config.json").is_file()
    assert config.read_text() == text  # nothing above wrote the keys in
    config.write_text(text.replace("steps = 2\n", "steps = 3\n"))
    summary = json.loads(lenx("train", "--resume", "runs/old", cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert summary["step"] == 3 and summary["finished"]
