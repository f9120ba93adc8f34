"""`lenx export` on a trained run: the folder's files, its tokenizer, the run's logits and
generation through transformers, kept weights (--step), and the CLI as a user runs it (relative
paths from another folder, one-line errors, --force, nothing left behind by a failed export)."""

import json
import os
from pathlib import Path
import subprocess
import sys

import pytest
import torch

from export_helpers import load

pytest.importorskip("transformers")

SRC = Path(__file__).resolve().parents[2] / "src"
FILES = ["README.md", "config.json", "configuration_lenx.py", "generation_config.json", "lm_eval_tasks",
         "model.safetensors", "modeling_lenx.py", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]


def lenx(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


def one_line_error(out, *needles):
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error:"), out.stderr[-3000:]
    assert all(n in lines[0] for n in needles), lines[0]


def test_the_folder_holds_config_code_weights_and_tokenizer(exported, run):
    assert sorted(p.name for p in exported.iterdir()) == FILES
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "lenx" and config["architectures"] == ["LenxForCausalLM"]
    assert config["auto_map"] == {"AutoConfig": "configuration_lenx.LenxConfig",
                                  "AutoModelForCausalLM": "modeling_lenx.LenxForCausalLM"}
    assert config["lenx"]["method"] == "rope" and config["lenx"]["backend"] == "auto"
    # the run's folder name, not its path (the folder is made to be shared), and how far it trained
    assert config["lenx_source"] == {"run": run.name, "step": 2, "steps": 2, "finished": True, "corpus": "words"}
    assert str(run.parent) not in (exported / "README.md").read_text() + (exported / "config.json").read_text()
    assert config["max_position_embeddings"] == config["train_len"] == 32
    assert "pip install 'lenx[hf]" in (exported / "modeling_lenx.py").read_text()
    # the weights are as readable as the rest of the folder (safetensors makes its files private)
    modes = {(exported / name).stat().st_mode & 0o777 for name in ("config.json", "model.safetensors")}
    assert len(modes) == 1
    assert "from the run `rope`, step 2 of 2:" in " ".join((exported / "README.md").read_text().split())


@pytest.mark.parametrize("how", ["AutoTokenizer", "PreTrainedTokenizerFast"])
def test_the_tokenizer_is_the_corpus_s(exported, words_root, how):
    import transformers

    from lenx.data import open_corpus

    corpus = open_corpus("words", words_root)
    # AutoTokenizer reads config.json first, whose AutoConfig is the folder's code
    kwargs = {"trust_remote_code": True} if how == "AutoTokenizer" else {}
    tok = getattr(transformers, how).from_pretrained(exported, **kwargs)
    text = "river stone é <|endoftext|> garden 0123."  # a literal end-of-text marker stays text, as lenx reads it
    ids = tok(text)["input_ids"]
    assert ids == corpus.encode(text) and corpus.eos_id not in ids
    assert tok.decode(ids) == corpus.decode(ids) == text
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == corpus.eos_id
    # EOS pads, as generation_config.json says
    generation = json.loads((exported / "generation_config.json").read_text())
    assert tok.pad_token == tok.eos_token and tok.pad_token_id == generation["pad_token_id"] == corpus.eos_id
    assert sorted(tok(text)) == ["attention_mask", "input_ids"]


def test_transformers_gives_the_run_s_logits_and_generation(exported, run, words_root):
    from transformers import AutoTokenizer

    from lenx.data import open_corpus
    from lenx.model.generate import generate
    from lenx.runs import load_run

    lm, _ = load_run(run, torch.device("cpu"))
    hf = load(exported)
    corpus = open_corpus("words", words_root)
    ids = torch.tensor([corpus.encode("north garden paper silver window market orchard river")])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, lm(ids)[0], atol=1e-5, rtol=0)
    want = generate(lm, ids, 10, temperature=0)["tokens"][0].tolist()
    want = want[:want.index(corpus.eos_id) + 1] if corpus.eos_id in want else want  # generate() stops at EOS
    tok = AutoTokenizer.from_pretrained(exported, trust_remote_code=True)
    got = hf.generate(**tok("north garden paper silver window market orchard river", return_tensors="pt"),
                      max_new_tokens=10, do_sample=False)
    assert got[0, ids.shape[1]:].tolist() == want


def test_the_readme_recipe_generates_from_a_left_padded_batch(exported):
    """README: tokenizer.padding_side = "left", then tokenizer(prompts, padding=True): each row gives
    the tokens of its prompt alone."""
    from transformers import AutoTokenizer

    model = load(exported)
    tokenizer = AutoTokenizer.from_pretrained(exported, trust_remote_code=True)
    tokenizer.padding_side = "left"
    prompts = ["river stone", "north garden paper silver window", "market"]
    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=6, do_sample=False, min_new_tokens=6)
    for row, prompt in zip(out, prompts):
        alone = model.generate(**tokenizer(prompt, return_tensors="pt"), max_new_tokens=6, do_sample=False,
                               min_new_tokens=6)
        assert row[-6:].tolist() == alone[0, -6:].tolist()


def test_the_offline_lm_eval_line_of_the_card_runs(exported, tmp_path):
    """The lm_eval line that the folder's README.md gives (and the repository's README, for its paths)
    runs as written with no network (HF_DATASETS_OFFLINE=1) and scores the folder's task."""
    import shlex

    pytest.importorskip("lm_eval")
    pytest.importorskip("accelerate")
    card = (exported / "README.md").read_text()
    line = card.split("```\n")[-2].replace("\\\n", " ")  # the last code block, one command
    env_assign, command = line.split(" ", 1)
    assert env_assign == "HF_DATASETS_OFFLINE=1" and command.startswith("lm_eval --model hf")
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    args = shlex.split(command)[1:] + ["--output_path", str(tmp_path / "results")]
    out = subprocess.run([sys.executable, "-m", "lm_eval", *args], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    saved = json.loads(next((tmp_path / "results").rglob("results_*.json")).read_text())
    bpb = saved["results"]["lenx_text"]["bits_per_byte,none"]
    assert 0 < bpb < 20  # a random-ish model: a few bits per byte, finite
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    one_line = " ".join(readme.replace("\\\n", " ").split())
    assert " ".join(command.replace(str(exported), "exported/dv2").split()) in one_line


def test_kept_weights_export_with_step(run, tmp_path):
    from lenx.export.folder import export_run
    from lenx.runs import load_run

    result = export_run(run, tmp_path / "step1", step=1)
    assert result["step"] == 1 and result["tokenizer"] and result["files"] == FILES
    lm, _ = load_run(run, torch.device("cpu"), step=1)
    ids = torch.randint(0, 300, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(load(tmp_path / "step1")(ids).logits, lm(ids)[0], atol=1e-5, rtol=0)


def test_the_cli_from_another_folder_with_relative_paths(run, tmp_path):
    where = tmp_path / "elsewhere"
    where.mkdir()
    rel = os.path.relpath(run, where)
    out = lenx("export", rel, "models/rope", cwd=where)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stdout.startswith("wrote models/rope: rope, step 2") and "its tokenizer" in out.stdout, out.stdout
    assert sorted(p.name for p in (where / "models" / "rope").iterdir()) == FILES
    one_line_error(lenx("export", rel, "models/rope", cwd=where), "holds an earlier lenx export", "--force")
    help_out = lenx("export", "--help", cwd=where)
    assert help_out.returncode == 0 and "transformers" in help_out.stdout and "--force" in help_out.stdout


def test_force_replaces_an_earlier_export_and_nothing_else(run, tmp_path):
    from lenx.export.folder import ExportError, export_run
    from lenx.fileio import OutputError
    from lenx.model.checkpoint import CheckpointError

    export_run(run, tmp_path / "out")
    first = (tmp_path / "out" / "model.safetensors").read_bytes()
    export_run(run, tmp_path / "out", step=1, force=True)
    assert (tmp_path / "out" / "model.safetensors").read_bytes() != first
    assert json.loads((tmp_path / "out" / "config.json").read_text())["lenx_source"]["step"] == 1
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("")
    with pytest.raises(ExportError, match="holds other files: give lenx export a new or empty folder"):
        export_run(run, tmp_path / "mine", force=True)
    with pytest.raises(OutputError, match="is a file"):
        export_run(run, tmp_path / "file")
    with pytest.raises(CheckpointError, match=r"kept no checkpoint of step 7 \(kept steps: 1, 2\)"):
        export_run(run, tmp_path / "new", step=7)
    with pytest.raises(CheckpointError, match="not a lenx run directory"):
        export_run(tmp_path / "mine", tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "mine", "out"]
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_a_failed_export_leaves_the_earlier_one_and_nothing_else(run, tmp_path, monkeypatch):
    from lenx.export import folder

    out = tmp_path / "exported"
    folder.export_run(run, out, step=1)
    def files():
        return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    before = files()

    def differ(*args, **kwargs):
        raise folder.ExportError("the exported model's logits differ from the run's")

    monkeypatch.setattr(folder, "check_folder", differ)
    with pytest.raises(folder.ExportError, match="differ"):
        folder.export_run(run, out, force=True)
    with pytest.raises(folder.ExportError, match="differ"):
        folder.export_run(run, tmp_path / "new" / "deeper" / "model")
    assert files() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported"]


def test_without_transformers_export_names_the_extra(monkeypatch):
    from lenx.export.folder import ExportError, transformers_classes

    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ExportError, match=r"needs transformers: pip install 'lenx\[hf\]'"):
        transformers_classes()


def test_a_token_level_corpus_exports_without_a_tokenizer(tmp_path):
    from lenx.config import load_config
    from lenx.export.folder import export_run
    from lenx.training.loop import train

    sets = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=16", "train.batch_size=2",
            "train.steps=1", "train.device=cpu", f"data.root={str(tmp_path / 'data')!r}"]
    train(load_config("tiny", sets), tmp_path / "run", progress=False)
    result = export_run(tmp_path / "run", tmp_path / "out")
    assert not result["tokenizer"] and "tokenizer.json" not in result["files"]
    card = (tmp_path / "out" / "README.md").read_text()
    # no lm-eval line or task: the harness needs a tokenizer
    assert "no tokenizer" in card and "lm_eval" not in card and "lm_eval_tasks" not in result["files"]
    hf = load(tmp_path / "out")
    assert hf(torch.tensor([[1, 2, 3]])).logits.shape[-1] == hf.config.vocab_size


def test_an_unfinished_run_is_exported_with_a_note(words_root, tmp_path):
    """A run stopped at step 1 of 2 (--until): the export says so, and records it."""
    from conftest import TINY

    from lenx.config import load_config
    from lenx.training.loop import train

    train(load_config("tiny", TINY + [f"data.root={str(words_root)!r}"]), tmp_path / "part", progress=False, until=1)
    out = lenx("export", "part", "exp/part", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.splitlines() == ["note: part has not finished training: exported the weights of step 1 of 2 "
                                       "(recorded in exp/part/config.json and README.md)"]
    config = json.loads((tmp_path / "exp" / "part" / "config.json").read_text())
    assert config["lenx_source"] | {} == {"run": "part", "step": 1, "steps": 2, "finished": False, "corpus": "words"}
    assert "step 1 of 2 (the run had not finished training)" in " ".join(
        (tmp_path / "exp" / "part" / "README.md").read_text().split())
