"""`lenx eval --hf DIR` as a user runs it: a transformers model evaluated on the windows of a lenx
run, compared with it (per token with the corpus's tokenizer, per byte with another one) and plotted,
from relative paths in another working directory; bad input is one line."""

import json
import os
from pathlib import Path
import subprocess
import sys

import pytest

from hf_helpers import corpus_texts, corpus_tokenizer, gpt2_folder, llama_folder, own_tokenizer, text_corpus
from lenx.cli import app

SRC = Path(__file__).resolve().parents[2] / "src"


def lenx(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


def invoke(*args):
    from typer.testing import CliRunner

    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A working directory with a text corpus (data/words), a tiny lenx run trained and evaluated on it
    (run/), and two model folders: models/llama (the corpus's tokenizer) and models/gpt2 (its own)."""
    from lenx.config import load_config
    from lenx.evaluation.evaluate import evaluate
    from lenx.training.loop import train

    root = tmp_path_factory.mktemp("evalhf")
    corpus = text_corpus(root / "data", "words")
    cfg = load_config("tiny", ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=32",
                               "train.batch_size=4", "train.steps=2", "train.device=cpu", "data.corpus='words'",
                               f"data.root={str(root / 'data')!r}", "eval.windows=6", "eval.scored=16"])
    train(cfg, root / "run", progress=False)
    evaluate(root / "run", lengths=[32, 64, 128], device="cpu", progress=False)
    llama_folder(root / "models" / "llama", corpus_tokenizer(corpus))
    gpt2_folder(root / "models" / "gpt2", own_tokenizer(corpus_texts(corpus)))
    return root


def test_a_transformers_model_beside_a_lenx_run(workdir):
    out = lenx("eval", "--hf", "models/gpt2", "--like", "run", "-o", "evals/gpt2", "--no-progress", cwd=workdir)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr == ""  # no warnings or progress bars of transformers
    assert "bits per byte" in out.stdout and out.stdout.strip().endswith("wrote evals/gpt2/eval.json")
    result = json.loads((workdir / "evals" / "gpt2" / "eval.json").read_text())
    run = json.loads((workdir / "run" / "eval.json").read_text())
    for key in ("lengths", "windows", "scored", "split", "eval_seed", "window_documents", "corpus_fingerprint"):
        assert result[key] == run[key], key  # the run's windows
    assert result["method"] == "gpt2" and result["kind"] == "hf"
    assert run["window_bytes"]["scored"] and all("bpb" in row for row in run["results"].values())

    from lenx.evaluation.hf_eval import evaluate_hf  # the same route in the library, quicker than a process

    evaluate_hf(workdir / "models" / "llama", like=workdir / "run", out=workdir / "evals" / "llama", train_len=32,
                progress=False)
    # the corpus's tokenizer: perplexity per token, as between lenx runs
    same = lenx("compare", "run", "evals/llama", "-o", "same.json", "--resamples", "100", cwd=workdir)
    assert same.returncode == 0, same.stderr[-3000:]
    assert "different tokenizers" not in same.stdout and "perplexity of the last 16 tokens" in same.stdout
    report = json.loads((workdir / "same.json").read_text())
    assert report["unit"] == "ppl" and list(report["methods"]) == ["rope", "llama"]
    # another tokenizer: one line says so, and every figure is in bits per byte
    both = lenx("compare", "run", "evals", "-o", "both.json", "--reference", "rope", "--resamples", "100", cwd=workdir)
    assert both.returncode == 0, both.stderr[-3000:]
    notes = [line for line in both.stdout.splitlines() if "different tokenizers" in line]
    assert len(notes) == 1 and "bits per byte" in notes[0]
    report = json.loads((workdir / "both.json").read_text())
    assert report["unit"] == "bpb" and set(report["methods"]) == {"rope", "llama", "gpt2"}
    assert "bpb" in report["methods"]["gpt2"]["lengths"]["128"] and "delta_p" in report["methods"]["rope"]["lengths"]["64"]
    # its own tokenizer: the table says that the lengths and the (train) row count corpus tokens
    table = " ".join(out.stdout.split())
    assert "corpus tokens" in table.split("model tokens read")[0]
    assert "the lengths and the training length 1024 (ΔP's, the (train) row's) count corpus tokens" in table
    # and its figures: one model's, and those of the folder of models, drawn together
    plot = lenx("plot", "evals/gpt2", cwd=workdir)
    assert plot.returncode == 0 and (workdir / "evals" / "gpt2" / "perplexity.png").is_file(), plot.stderr
    plot = lenx("plot", "evals", cwd=workdir)
    assert plot.returncode == 0, plot.stderr
    assert plot.stdout.split() == ["evals/perplexity.png", "evals/delta_p.png"]
    assert (workdir / "evals" / "perplexity.png").is_file()


@pytest.mark.parametrize("args, needle", [
    (["--hf", "models/nowhere", "--corpus", "words"], "is not a folder"),
    (["--hf", "models/llama", "--corpus", "words", "--data-root", "data", "--rope-scaling", "yarn"],
     "config.json sets its RoPE scaling"),
])
def test_bad_input_is_one_line_and_writes_nothing(workdir, args, needle):
    before = sorted(str(p) for p in workdir.rglob("*"))
    out = lenx("eval", *args, cwd=workdir)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and out.stderr.startswith("error:"), out.stderr
    assert needle in out.stderr
    assert sorted(str(p) for p in workdir.rglob("*")) == before


@pytest.mark.parametrize("args, needle", [
    (["--step", "3"], "--step applies to lenx runs"),
    (["--backend", "sdpa"], "--backend applies to lenx runs"),
    (["--rope-scaling-factor", "2"], "config.json sets its RoPE scaling"),
    (["run"], "RUN applies to lenx runs"),
    (["--task", "copy", "--windows", "3"], "--windows and --scored belong"),
    (["--samples", "3"], "--depths and --samples belong to --task"),
    (["--task", "recall"], "--task must be one of"),
    (["--device", "tpu"], "--device"),
    (["--lengths", "abc"], "--lengths"),
])
def test_options_of_runs_and_of_the_other_route_are_refused(workdir, monkeypatch, args, needle):
    monkeypatch.chdir(workdir)
    out = invoke("eval", "--hf", "models/llama", "--corpus", "words", "--data-root", "data", *args)
    assert out.exit_code == 2 and needle in out.output, out.output


def test_hf_options_without_hf_are_refused(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    for option, value in (("--corpus", "words"), ("--like", "run"), ("-o", "x"), ("--name", "x"), ("--train-len", "8")):
        out = invoke("eval", "run", option, value)
        assert out.exit_code == 2 and "belongs to --hf" in out.output, out.output
    out = invoke("eval")
    assert out.exit_code == 2 and "give a run directory to evaluate" in out.output


def test_help_names_the_hf_options():
    out = lenx("eval", "--help", cwd=Path.cwd())
    assert out.returncode == 0
    for option in ("--hf", "--corpus", "--data-root", "--like", "--out", "--name", "--train-len"):
        assert option in out.stdout, option


def tiny_run(cwd: Path, out: str, corpus: str, root: str = "data") -> None:
    cmd = ["train", "-c", "tiny", "-o", out, "--no-progress", "--set", f"data.corpus={corpus!r}",
           "--set", f"data.root={root!r}"]
    for key in ("model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=32", "train.batch_size=4",
                "train.steps=2", "train.device='cpu'", "eval.windows=4", "eval.scored=16"):
        cmd += ["--set", key]
    out = lenx(*cmd, cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]


def test_a_token_level_run_needs_a_text_corpus(workdir, tmp_path):
    """The README's `lenx eval --hf exported/dv2 --like runs/dv2` with dv2 trained on the token-level
    synthetic corpus: its export has no tokenizer, but what stops it is the corpus, and the error says so."""
    tiny_run(tmp_path, "runs/dv2", "synthetic")
    exported = tmp_path / "exported" / "dv2"
    exported.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):  # a model folder without a tokenizer, as such an export is
        (exported / f).write_bytes((workdir / "models" / "llama" / f).read_bytes())
    out = lenx("eval", "--hf", "exported/dv2", "--like", "runs/dv2", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: --like runs/dv2 was trained on the token-level corpus 'synthetic': --hf "
                                 "reads text in the model's own tokens, so it needs a text corpus"), out.stderr
    out = lenx("eval", "--hf", "exported/dv2", "--corpus", "synthetic", cwd=tmp_path)
    assert out.returncode == 2 and "error: corpus 'synthetic' is token-level: --hf reads text" in out.stderr


def test_a_like_run_whose_corpus_was_prepared_anew_is_refused(workdir, tmp_path):
    """As `lenx eval RUN` refuses it: the windows of a corpus the run was not trained on are not its windows."""
    from hf_helpers import text_corpus

    from lenx.data.build import prepare_corpus

    text_corpus(tmp_path / "data", "idc")
    tiny_run(tmp_path, "runs/idc", "idc")
    other = tmp_path / "data" / "idc-texts"
    for doc in sorted(other.iterdir())[::2]:  # the same name, other documents
        doc.unlink()
    prepare_corpus("idc", tmp_path / "data", from_path=other, vocab_size=300, progress=False, val_frac=0.1,
                   test_frac=0.3, force=True)
    before = sorted(p.name for p in tmp_path.iterdir())
    model = os.path.relpath(workdir / "models" / "llama", tmp_path)
    out = lenx("eval", "--hf", model, "--like", "runs/idc", "-o", "hf/llama", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: corpus 'idc' at ") and "is not the one runs/idc was trained on" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
