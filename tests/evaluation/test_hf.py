"""`lenx eval --hf` in the library (lenx.evaluation.hf, hf_eval): small transformers models built
here, each result checked against the same NLL computed directly with the model's own forward."""

import bisect
import functools
import json
import math
import os
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from hf_helpers import corpus_texts, corpus_tokenizer, gpt2_folder, llama_folder, own_tokenizer, text_corpus
from lenx.config import ConfigError
from lenx.evaluation.evaluate import _window_bytes, eval_windows_with_documents
from lenx.evaluation.hf import HFReader, check_folder, load_model
from lenx.evaluation.hf_eval import evaluate_hf, evaluate_hf_task

SRC = Path(__file__).resolve().parents[2] / "src"
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
SETTINGS = dict(corpus="words", lengths=[32, 64, 128], windows=6, scored=16, device="cpu", progress=False)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """An ASCII text corpus (data/words), and model folders: two Llamas with the same weights and the
    corpus's tokenizer, one with YaRN in its config; a GPT-2 with a tokenizer of its own."""
    root = tmp_path_factory.mktemp("hf")
    corpus = text_corpus(root / "data", "words")
    same = corpus_tokenizer(corpus)
    llama_folder(root / "llama-yarn", same, rope_scaling=YARN)
    llama_folder(root / "llama", same)
    gpt2_folder(root / "gpt2", own_tokenizer(corpus_texts(corpus)))
    return root, corpus


def run_hf(world, folder, **options):
    root, _ = world
    return evaluate_hf(root / folder, data_root=root / "data", **(SETTINGS | {"write": False} | options))


@functools.cache
def hf_model(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()


def direct_nll(folder: Path, ids: list[int]) -> np.ndarray:
    """NLL of ids[1:] after the tokens before each, from the model's own logits (float64)."""
    model = hf_model(folder)
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x[:, :-1]).logits[0].double()
    return F.cross_entropy(logits, x[0, 1:], reduction="none").numpy()


def test_with_the_corpus_tokenizer_it_is_lenx_protocol(world):
    """The model reads the corpus's ids: every number is evaluate.py's formula over the model's own
    logits on lenx's windows (the same windows, documents, ΔP and in-distribution point)."""
    root, corpus = world
    r = run_hf(world, "llama-yarn", train_len=64)
    assert r["tokenizer"]["same_as_corpus"] and r["kind"] == "hf" and r["method"] == "llama-yarn"
    data, note, documents = eval_windows_with_documents(corpus, "test", 128, 6, 1234)
    assert r["window_documents"] == documents.tolist() and r["window_note"] == note
    nll = {L: np.stack([direct_nll(root / "llama-yarn", list(w[-(L + 1):])) for w in data]) for L in (32, 64, 128)}
    for L, rows in nll.items():
        row = r["results"][str(L)]
        assert math.isclose(row["ppl"], math.exp(rows[:, -16:].mean()), rel_tol=1e-5)
        assert math.isclose(row["ppl_full"], math.exp(rows.mean()), rel_tol=1e-5)
        assert np.allclose(row["window_nll"], rows[:, -16:].mean(1), atol=2e-6)
        assert row["input_tokens"] == [L] * 6
        # bits per byte: ASCII text, so bytes are characters
        sizes = np.array([len(corpus.decode(w[-16:])) for w in data])
        assert r["window_bytes"]["scored"] == sizes.tolist()
        assert math.isclose(row["bpb"], np.mean(rows[:, -16:].sum(1) / sizes) / math.log(2), rel_tol=1e-5)
    short = nll[64][:, -32:]  # ΔP: the last min(T, 32) tokens read with T = 64 tokens, and at 128
    assert math.isclose(r["in_distribution"]["ppl"], math.exp(short.mean()), rel_tol=1e-5)
    assert math.isclose(r["results"]["128"]["delta_p"], math.exp(short.mean()) - math.exp(nll[128][:, -32:].mean()),
                        rel_tol=1e-4, abs_tol=1e-6)
    assert "delta_p" not in r["results"]["64"] and r["delta_p_tokens"] == 32
    assert r["window_tokens"] == {"scored": [16] * 6, "delta_p": [32] * 6}
    # lenx's own evaluation records the same bytes and bits per byte from the same NLLs
    per_length = {str(L): {} for L in nll}
    extra = _window_bytes(corpus, data, {L: torch.from_numpy(v) for L, v in nll.items()}, 16, 32, per_length)
    assert extra["window_bytes"] == r["window_bytes"]
    for L in nll:
        assert math.isclose(per_length[str(L)]["bpb"], r["results"][str(L)]["bpb"], rel_tol=1e-5)


def test_the_models_own_rope_scaling_is_honoured_and_recorded(world):
    yarn, plain = run_hf(world, "llama-yarn", train_len=64), run_hf(world, "llama", train_len=64)
    assert YARN.items() <= yarn["hf_config"]["rope"].items()
    assert plain["hf_config"]["rope"].get("rope_type", "default") == "default"
    assert yarn["results"]["128"]["ppl"] != plain["results"]["128"]["ppl"]  # same weights, other positions
    assert run_hf(world, "llama-yarn")["train_len"] == 64  # YaRN's original length is the training length


def test_another_tokenizer_reads_the_same_text(world):
    """GPT-2 with its own BPE: the window's text in its tokens; the scored tokens start at the scored
    corpus tokens' first character; checked against a plain re-implementation on the ASCII text."""
    root, corpus = world
    from transformers import AutoTokenizer

    r = run_hf(world, "gpt2")
    assert not r["tokenizer"]["same_as_corpus"] and r["train_len"] == 1024 and "delta_p" not in r["results"]["128"]
    tok = AutoTokenizer.from_pretrained(root / "gpt2")
    data, _, _ = eval_windows_with_documents(corpus, "test", 128, 6, 1234)
    n, bits = data.shape[1], {32: [], 128: []}
    for i, w in enumerate(data):
        text = corpus.decode(w)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        starts = [a for a, _ in enc["offset_mapping"]]

        def first(k):
            return bisect.bisect_left(starts, len(corpus.decode(w[:k])))

        j, d = first(n - 16), first(n - 32)
        assert r["window_tokens"]["scored"][i] == len(starts) - j and r["window_tokens"]["delta_p"][i] == len(starts) - d
        assert r["window_bytes"]["scored"][i] == len(text) - starts[j]
        for L in (32, 128):
            s = min(first(n - L - 1), j - 1, d - 1)
            nll = direct_nll(root / "gpt2", enc["input_ids"][s:])
            assert r["results"][str(L)]["input_tokens"][i] == len(starts) - s - 1
            assert math.isclose(r["results"][str(L)]["window_nll"][i], nll[j - s - 1:].mean(), abs_tol=2e-6)
            bits[L].append(nll[j - s - 1:].sum() / (len(text) - starts[j]) / math.log(2))
    for L in (32, 128):
        assert math.isclose(r["results"][str(L)]["bpb"], np.mean(bits[L]), rel_tol=1e-5)


def test_the_reader_pads_batches_and_slices_the_head_without_changing_a_number(world):
    root, _ = world
    for name in ("llama-yarn", "gpt2"):
        reader = load_model(root / name, torch.device("cpu"))
        assert isinstance(reader, HFReader) and reader.head_on_scored
        rng = np.random.default_rng(0)
        seqs = [rng.integers(0, 250, size=n) for n in (40, 17, 33)]
        together = reader.read(seqs, [1, 5, 30], budget=10_000)
        alone = [reader.read([s], [f], budget=1)[0] for s, f in zip(seqs, [1, 5, 30])]
        reader.head_on_scored = False  # the model's own logits instead of the head on the scored rows
        whole = reader.read(seqs, [1, 5, 30], budget=10_000)
        for (a, pa), (b, pb), (c, pc), s, f in zip(together, alone, whole, seqs, [1, 5, 30]):
            assert len(a) == len(s) - f and np.allclose(a, b, atol=1e-5) and np.allclose(a, c, atol=1e-5)
            assert (pa == pb).all() and (pa == pc).all()
            assert np.allclose(a, direct_nll(root / name, list(s))[f - 1:], atol=1e-5)


def test_generation_through_the_models_cache_equals_the_whole_forward(world):
    root, _ = world
    from lenx.model.generate import generate

    for name in ("llama-yarn", "gpt2"):
        reader = load_model(root / name, torch.device("cpu"))
        prompt = torch.arange(3, 23)[None]
        new = generate(reader, prompt, 5, temperature=0)["tokens"][0]
        ids = prompt[0].tolist()
        for token in new.tolist():  # greedy, one whole forward per step
            with torch.no_grad():
                ids.append(int(reader.model(torch.tensor([ids])).logits[0, -1].argmax()))
            assert ids[-1] == token


def test_retrieval_tasks(world):
    root, corpus = world
    from lenx.evaluation import retrieval

    r = evaluate_hf_task(root / "llama", "copy", corpus="words", data_root=root / "data", lengths=[64, 128],
                         depths=[0.0, 1.0], samples=2, device="cpu", progress=False, write=False)
    assert r["task"] == "copy" and np.array(r["accuracy"]).shape == (2, 2) and r["chance"] == 1 / 300
    for a, L in enumerate((64, 128)):  # the same tokenizer: the model's argmax over lenx's own copy inputs
        cases = retrieval.copy_inputs(corpus, "test", L, 1.0, 2, 1234)
        acc = []
        for case in cases:
            with torch.no_grad():
                logits = hf_model(root / "llama")(torch.from_numpy(case["input"][:-1])[None]).logits[0, -24:]
            acc.append((logits.argmax(-1).numpy() == case["targets"]).mean())
        assert math.isclose(r["accuracy"][a][1], np.mean(acc))
    for name in ("llama", "gpt2"):
        r = evaluate_hf_task(root / name, "passkey", corpus="words", data_root=root / "data", lengths=[128],
                             depths=[0.5], samples=2, device="cpu", progress=False, write=False)
        assert 0 <= r["exact"][0][0] <= 1 and r["logprob"][0][0] < 0 and r["chance"] == 1 / 90000


def test_results_land_in_an_output_folder_that_keeps_another_models_evaluation(world, tmp_path, capsys):
    root, _ = world
    out = tmp_path / "evals" / "m"
    first = run_hf(world, "llama", out=out, write=True, name="m")
    assert json.loads((out / "eval.json").read_text())["results"] == json.loads(json.dumps(first["results"]))
    meta = json.loads((out / "meta.json").read_text())
    assert meta["kind"] == "hf" and meta["method"] == "m" and meta["vocab_size"] == 300
    assert meta["model"] == str((root / "llama").resolve()) and meta["tokenizer"]["same_as_corpus"]
    run_hf(world, "llama", out=out, write=True, name="m")  # the same evaluation again replaces itself
    assert sorted(p.name for p in out.iterdir()) == ["eval.json", "meta.json"]
    run_hf(world, "llama-yarn", out=out, write=True, name="m")  # another model: the first one is kept
    kept = list(out.glob("eval.*.json"))
    assert len(kept) == 1
    # the note names what differs: the model, not settings that are the same
    assert capsys.readouterr().err.strip() == (f"note: {out / 'eval.json'} held an evaluation of another model "
                                               f"(llama); kept it as {kept[0]}")


def error(world, match, folder="llama", **options):
    root, _ = world
    with pytest.raises(ConfigError, match=match):
        evaluate_hf(root / folder, data_root=options.pop("data_root", root / "data"), write=options.pop("write", False),
                    **(SETTINGS | options))


def test_bad_model_folders_are_one_line_errors(world, tmp_path):
    from transformers import LlamaConfig, T5Config

    root, corpus = world
    error(world, "is not a folder", folder="nowhere")
    error(world, "no config.json", folder="data")
    T5Config(d_model=16, num_layers=1).save_pretrained(tmp_path / "t5")
    error(world, "not a causal LM", folder=tmp_path / "t5")
    LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2).save_pretrained(tmp_path / "bare")
    error(world, "no weights", folder=tmp_path / "bare")
    llama_folder(tmp_path / "notok", corpus_tokenizer(corpus))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "notok" / name).unlink()
    error(world, "has no tokenizer", folder=tmp_path / "notok")
    big = own_tokenizer(corpus_texts(corpus), vocab_size=400)  # ids beyond the model's 300 rows
    (tmp_path / "mismatch").mkdir()
    for f in (root / "llama").iterdir():
        (tmp_path / "mismatch" / f.name).write_bytes(f.read_bytes())
    big.save_pretrained(tmp_path / "mismatch")
    error(world, "embedding has 300 rows", folder=tmp_path / "mismatch")
    gpt2_folder(tmp_path / "short", own_tokenizer(corpus_texts(corpus)), n_positions=64)
    error(world, "learned position table holds 64", folder=tmp_path / "short")


def bert_folder(path: Path, tokenizer, is_decoder: bool = False) -> Path:
    """A random 1-layer BERT (a bidirectional encoder; with is_decoder, BERT built as a causal decoder)."""
    from transformers import BertConfig, BertLMHeadModel, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512, is_decoder=is_decoder)
    (BertLMHeadModel if is_decoder else BertModel)(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_bidirectional_encoder_is_not_a_causal_lm(world, tmp_path):
    """transformers has a causal-LM class for BERT, but a BERT folder's attention sees the tokens
    after each one: refused before the position table is looked at, at given and default lengths."""
    root, corpus = world
    bert = bert_folder(tmp_path / "bert", corpus_tokenizer(corpus))
    for lengths in ([32, 64, 128], None):  # None: the defaults, past BERT's 512 positions
        with pytest.raises(ConfigError, match=r"bert is not a causal LM \(a 'bert' model with is_decoder false: a "
                                              r"bidirectional encoder.*names BertModel\)"):
            evaluate_hf(bert, data_root=root / "data", **(SETTINGS | {"lengths": lengths, "write": False}))
    decoder = bert_folder(tmp_path / "bert-decoder", corpus_tokenizer(corpus), is_decoder=True)
    config, _ = check_folder(decoder)  # BERT built as a decoder is causal
    assert config.is_decoder
    check_folder(root / "llama")
    check_folder(root / "gpt2")


def test_a_learned_position_table_holds_exactly_its_length(world, tmp_path):
    """The model reads all but the predicted last token: a 64-position GPT-2 reads 64 tokens at
    length 64 (the corpus's tokenizer: corpus tokens are model tokens), and 65 is refused."""
    root, corpus = world
    folder = gpt2_folder(tmp_path / "gpt2-64", corpus_tokenizer(corpus), n_positions=64)
    r = evaluate_hf(folder, data_root=root / "data", **(SETTINGS | {"lengths": [32, 64], "write": False}))
    assert r["results"]["64"]["input_tokens"] == [64] * 6
    # the numbers are the model's own at exactly its table's length
    data, _, _ = eval_windows_with_documents(corpus, "test", 64, 6, 1234)
    want = np.stack([direct_nll(folder, list(w)) for w in data])[:, -16:].mean(1)
    assert np.allclose(r["results"]["64"]["window_nll"], want, atol=2e-6)
    error(world, "the longest input is 65 of the model's tokens, but its learned position table holds 64",
          folder=folder, lengths=[32, 65])


def test_bad_options_are_one_line_errors(world, tmp_path):
    root, _ = world
    error(world, "--corpus NAME", corpus=None)
    error(world, "not both", like=root / "llama")
    error(world, "shorter than the 16 scored tokens", lengths=[8, 32])
    error(world, "bad --name", name="a/b")
    error(world, "--train-len must be a positive integer", train_len=0)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.toml").write_text("")
    error(world, "is a lenx run folder", out=tmp_path / "run", write=True)
    with pytest.raises(ConfigError, match="--task must be one of"):
        evaluate_hf_task(root / "llama", "recall", corpus="words", data_root=root / "data")


def test_without_transformers_the_error_says_how_to_install_it(world, monkeypatch):
    root, _ = world
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now fails
    with pytest.raises(ConfigError, match=r"pip install 'lenx\[hf\]'"):
        check_folder(root / "llama")


def test_importing_lenx_loads_no_transformers():
    code = ("import sys, lenx.cli, lenx.evaluation.hf, lenx.evaluation.hf_eval, lenx.report.compare\n"
            "print('transformers' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


@pytest.mark.gpu
def test_on_the_gpu_in_bfloat16(world, tmp_path):
    """A bfloat16 model keeps its dtype on CUDA and agrees with its float32 copy on the CPU to
    bfloat16's precision; a long window is read one at a time within the token budget."""
    from transformers import AutoModelForCausalLM

    root, corpus = world
    model = AutoModelForCausalLM.from_pretrained(root / "llama-yarn")
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    corpus_tokenizer(corpus).save_pretrained(tmp_path / "bf16")
    gpu = evaluate_hf(tmp_path / "bf16", data_root=root / "data", write=False, train_len=64,
                      **(SETTINGS | {"device": "cuda", "lengths": [32, 64, 1024]}))
    cpu = run_hf(world, "llama-yarn", train_len=64, lengths=[32, 64, 1024])
    assert gpu["dtype"] == "bfloat16" and gpu["device"].startswith("cuda")
    for L in ("32", "64", "1024"):
        assert math.isclose(gpu["results"][L]["ppl"], cpu["results"][L]["ppl"], rel_tol=0.05)
    long = evaluate_hf(tmp_path / "bf16", data_root=root / "data", write=False, train_len=64, token_budget=1024,
                       **(SETTINGS | {"device": "cuda", "lengths": [1024]}))
    assert math.isclose(long["results"]["1024"]["ppl"], gpu["results"]["1024"]["ppl"], rel_tol=1e-3)
