"""lm-evaluation-harness on an exported run: a multiple-choice task and a generation task, each a
local YAML over a local JSONL (nothing is downloaded), run with lm-eval's hf model and
trust_remote_code. Its loglikelihoods are lenx's own, and its generations lenx's greedy decoding."""

import json

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")  # lm-eval's hf model imports it

ROWS = [{"query": "river stone light", "choices": ["north", "garden", "paper", "silver"], "gold": 1},
        {"query": "market orchard", "choices": ["river", "window", "stone", "light"], "gold": 0},
        {"query": "paper silver window", "choices": ["market", "orchard", "north", "garden"], "gold": 2},
        {"query": "garden", "choices": ["light", "stone", "river", "paper"], "gold": 3}]
CHOICE = """task: lenx_words_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {rows}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{query}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
metric_list:
  - metric: acc
"""
GENERATE = """task: lenx_words_generate
dataset_path: json
dataset_kwargs:
  data_files:
    test: {rows}
test_split: test
output_type: generate_until
doc_to_text: "{{{{query}}}}"
doc_to_target: "{{{{choices[gold]}}}}"
generation_kwargs:
  until: ["."]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def results(exported, tmp_path_factory):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    tasks = tmp_path_factory.mktemp("tasks")
    rows = tasks / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tasks / "choice.yaml").write_text(CHOICE.format(rows=rows))
    (tasks / "generate.yaml").write_text(GENERATE.format(rows=rows))
    return simple_evaluate(model="hf", model_args=f"pretrained={exported},trust_remote_code=True",
                           tasks=["lenx_words_choice", "lenx_words_generate"],
                           task_manager=TaskManager(include_path=str(tasks)), device="cpu", batch_size=1,
                           log_samples=True, bootstrap_iters=0)


@pytest.fixture(scope="module")
def lenx_run(run, words_root):
    from lenx.data import open_corpus
    from lenx.runs import load_run

    return load_run(run, torch.device("cpu"))[0], open_corpus("words", words_root)


def test_the_harness_scores_the_exported_model(results):
    assert 0 <= results["results"]["lenx_words_choice"]["acc,none"] <= 1
    assert "exact_match,none" in results["results"]["lenx_words_generate"]


def test_its_loglikelihoods_are_lenx_s(results, lenx_run):
    lm, corpus = lenx_run
    sample = next(s for s in results["samples"]["lenx_words_choice"] if s["doc"] == ROWS[0])
    got = [float(r[0][0]) for r in sample["resps"]]
    context = corpus.encode(ROWS[0]["query"])
    want = []
    for choice in ROWS[0]["choices"]:
        whole = corpus.encode(ROWS[0]["query"] + " " + choice)  # lm-eval's target delimiter is a space
        assert whole[:len(context)] == context
        with torch.no_grad():
            logp = lm(torch.tensor([whole[:-1]]))[0][0].log_softmax(-1)
        want.append(sum(float(logp[i - 1, whole[i]]) for i in range(len(context), len(whole))))
    assert got == pytest.approx(want, abs=1e-4)


def test_its_generations_are_lenx_s_greedy_decoding(results, lenx_run):
    from lenx.model.generate import generate

    lm, corpus = lenx_run
    for sample in results["samples"]["lenx_words_generate"]:
        ids = torch.tensor([corpus.encode(sample["doc"]["query"])])
        new = generate(lm, ids, 6, temperature=0)["tokens"][0].tolist()
        new = new[:new.index(corpus.eos_id)] if corpus.eos_id in new else new  # generate() stops at the EOS
        assert sample["resps"][0][0] == corpus.decode(new).split(".")[0]
