"""`lenx train --resume` after train.steps was raised in a finished, evaluated run's config.toml
keeps what was measured (the newcomer audit of 2026-11-28, top-5 #2): the evaluated weights as
ckpt/step_<N>, the evaluations under the names `lenx eval --step N` gives, and one note on stderr.
Run through the CLI from a scratch folder, with relative paths, as the audit did. Also: checkpoint
weights get a new file's permissions (umask), not safetensors' 0600."""

import hashlib
import json
import os
from pathlib import Path
import shutil
import subprocess
import sys

import lenx

SRC = str(Path(lenx.__file__).resolve().parents[1])
TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=32", "train.batch_size=4",
        "train.steps=4", "train.ckpt_every=2", "eval.max_length=64", "eval.windows=2", "eval.scored=16",
        "train.device=cpu"]


def lenx_cli(*args, cwd, umask=None):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600, cwd=cwd,
                          env=env, preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


def ok(out):
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    return out


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_resume_after_raising_steps_keeps_the_evaluation_and_its_weights(tmp_path):
    sets = [a for s in TINY for a in ("--set", s)]
    ok(lenx_cli("train", *sets, "-o", "runs/idc", cwd=tmp_path))
    ok(lenx_cli("eval", "runs/idc", cwd=tmp_path))
    ok(lenx_cli("eval", "runs/idc", "--task", "copy", "--lengths", "64", "--depths", "0.5", "--samples", "1",
                cwd=tmp_path))
    shutil.copytree(tmp_path / "runs/idc", tmp_path / "runs/idc_ext")
    ext = tmp_path / "runs/idc_ext"
    measured, weights = (ext / "eval.json").read_text(), sha(ext / "ckpt/model.safetensors")
    config = ext / "config.toml"
    assert "steps = 4\n" in config.read_text()
    config.write_text(config.read_text().replace("steps = 4\n", "steps = 8\n"))

    out = ok(lenx_cli("train", "--resume", "runs/idc_ext", cwd=tmp_path))
    notes = [line for line in out.stderr.splitlines() if "kept the evaluation of step 4" in line]
    assert len(notes) == 1 and "eval_step4.json" in notes[0] and "ckpt/step_4" in notes[0], out.stderr
    assert (ext / "eval_step4.json").read_text() == measured and not (ext / "eval.json").exists()
    assert json.loads((ext / "eval_copy_step4.json").read_text())["step"] == 4
    assert sha(ext / "ckpt/step_4/model.safetensors") == weights  # the weights it measured
    assert json.loads(ok(lenx_cli("train", "--resume", "runs/idc_ext", cwd=tmp_path)).stdout)["step"] == 8

    # the kept step is measured again to the same numbers (the same evaluation replaces itself)
    again = ok(lenx_cli("eval", "runs/idc_ext", "--step", "4", cwd=tmp_path))
    assert "other settings" not in again.stderr
    before, after = json.loads(measured), json.loads((ext / "eval_step4.json").read_text())
    for L, row in before["results"].items():
        assert abs(after["results"][L]["ppl"] - row["ppl"]) <= 1e-6 * row["ppl"], L
    ok(lenx_cli("export", "runs/idc_ext", "exp4", "--step", "4", cwd=tmp_path))
    assert json.loads((tmp_path / "exp4/config.json").read_text())["lenx_source"]["step"] == 4
    # the latest weights are not evaluated yet: compare says so; after lenx eval, compare and plot work
    refused = lenx_cli("compare", "runs/idc_ext", cwd=tmp_path)
    assert refused.returncode == 2 and "no eval.json" in refused.stderr
    ok(lenx_cli("eval", "runs/idc_ext", cwd=tmp_path))
    assert json.loads((ext / "eval.json").read_text())["step"] == 8
    ok(lenx_cli("compare", "runs/idc_ext", "-o", "cmp", cwd=tmp_path))
    drawn = ok(lenx_cli("plot", "runs/idc_ext", cwd=tmp_path)).stdout
    assert "eval_step4_perplexity.png" in drawn and (ext / "perplexity.png").is_file()


def test_checkpoint_weights_get_the_mode_of_a_new_file(tmp_path):
    sets = [a for s in TINY for a in ("--set", s)]
    ok(lenx_cli("train", *sets, "--set", "train.keep_every=2", "-o", "run", cwd=tmp_path, umask=0o027))
    for name in ("ckpt/model.safetensors", "ckpt/state.pt", "ckpt/step_2/model.safetensors", "config.toml"):
        assert (tmp_path / "run" / name).stat().st_mode & 0o777 == 0o640, name
