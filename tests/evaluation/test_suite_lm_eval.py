"""`lenx suite-export` run under lm-evaluation-harness, offline, on a tiny transformers Llama: per
instance, lm-eval's scores are those of `lenx eval --hf DIR --task` on the same instances.

The Llama has a tokenizer of its own (not the corpus's), so lenx's --hf route reads each input as
text in the model's tokens, as lm-eval does (a model with the corpus's tokenizer reads lenx's ids
there, which can differ from the text's own tokenization where the haystack was cut mid-word).
Its EOS is <|endoftext|>, the text the export writes for a document break in the haystack."""

import json
import os

import numpy as np
import pytest

from hf_helpers import corpus_texts, llama_folder, own_tokenizer, text_corpus
from test_nothing_lost import lenx, ok

pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")  # lm-eval's hf model imports it

TASKS, LENGTHS, DEPTHS, SAMPLES = ("niah_single", "qa1"), [160, 224], [0.5], 2
# lm-eval sums the answer's log-probabilities in float32; lenx records each mean to 6 decimals
LOGPROB_TOL = 1e-3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("lmeval")
    corpus = text_corpus(root / "data", "words")
    tok = own_tokenizer(corpus_texts(corpus), eos="<|endoftext|>")
    llama_folder(root / "llama", tok)
    ok(lenx("suite-export", "../tasks", "--corpus", "words", "--data-root", "../data", "--task", ",".join(TASKS),
            "--lengths", ",".join(map(str, LENGTHS)), "--depths", "0.5", "--samples", str(SAMPLES),
            cwd=(root / "data").resolve()))
    return root, tok


@pytest.fixture(scope="module")
def lenx_scores(world, monkeypatch_module):
    """`lenx eval --hf` on the same grid, and the tokens its greedy decoding produced, in scoring order."""
    from lenx.evaluation.hf_eval import evaluate_hf_task
    from lenx.model import generate as gen

    root, _ = world
    made, real = [], gen.generate

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        made.append(out["tokens"][0].tolist())
        return out

    monkeypatch_module.setattr(gen, "generate", recording)
    result = evaluate_hf_task(root / "llama", ",".join(TASKS), corpus="words", data_root=root / "data",
                              lengths=LENGTHS, depths=DEPTHS, samples=SAMPLES, device="cpu", progress=False,
                              write=False)
    return result, made


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def harness(world):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    root, _ = world
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    before = {k: os.environ.get(k) for k in offline}
    os.environ.update(offline)
    try:
        return simple_evaluate(model="hf", model_args=f"pretrained={root / 'llama'},max_length=1024",
                               tasks=["lenx_suite"], task_manager=TaskManager(include_path=str(root / "tasks")),
                               device="cpu", batch_size=1, log_samples=True, bootstrap_iters=0)
    finally:
        for k, v in before.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def _by_instance(samples: list[dict]) -> dict:
    return {(s["doc"]["length"], s["doc"]["depth"], s["doc"]["index"]): s for s in samples}


def test_the_export_holds_the_instances_lenx_scores(world, lenx_scores):
    root, _ = world
    manifest = json.loads((root / "tasks" / "lenx_suite.json").read_text())
    result, _ = lenx_scores
    assert manifest["corpus_fingerprint"] == result["corpus_fingerprint"]
    for t in TASKS:
        assert manifest["tasks"][t]["instances"] == result["tasks"][t]["instances"]
        assert manifest["tasks"][t]["count"] == len(LENGTHS) * len(DEPTHS) * SAMPLES


def test_exact_match_per_instance_is_lenx_s(world, lenx_scores, harness):
    root, tok = world
    result, made = lenx_scores
    eos = tok.eos_token_id
    k = 0   # lenx scores tasks, lengths, depths, instances in this order
    for t in TASKS:
        samples = _by_instance(harness["samples"][f"lenx_{t}"])
        assert len(samples) == len(LENGTHS) * len(DEPTHS) * SAMPLES
        for a, L in enumerate(LENGTHS):
            for b, d in enumerate(DEPTHS):
                for i in range(SAMPLES):
                    s = samples[(L, d, i)]
                    assert s["exact"] == result["tasks"][t]["exact_cases"][a][b][i], (t, L, d, i)
                    # lenx's greedy tokens (up to an EOS) begin lm-eval's continuation, which may run longer
                    new = made[k][:made[k].index(eos)] if eos in made[k] else made[k]
                    assert s["resps"][0][0].startswith(tok.decode(new)), (t, L, i, s["resps"][0][0], tok.decode(new))
                    k += 1
    assert k == len(made)
    for t in TASKS:  # and the scores per length are the means of those instances
        exact = np.array(result["tasks"][t]["exact_cases"])
        row = harness["results"][f"lenx_{t}"]
        for a, L in enumerate(LENGTHS):
            assert row[f"exact_{L},none"] == pytest.approx(exact[a].mean())


def test_the_answer_logprob_per_instance_is_lenx_s(world, lenx_scores, harness):
    _, tok = world
    result, _ = lenx_scores
    for t in TASKS:
        samples = _by_instance(harness["samples"][f"lenx_{t}_logprob"])
        for a, L in enumerate(LENGTHS):
            for b, d in enumerate(DEPTHS):
                for i in range(SAMPLES):
                    s = samples[(L, d, i)]
                    n = len(tok(" " + s["doc"]["answer"], add_special_tokens=False)["input_ids"])
                    want = result["tasks"][t]["logprob_cases"][a][b][i] * n   # lenx: the mean per token
                    assert s["logprob_sum"] == pytest.approx(want, abs=LOGPROB_TOL), (t, L, i)
                    assert s["logprob_per_byte"] == pytest.approx(s["logprob_sum"] / len(s["doc"]["continuation"]))
