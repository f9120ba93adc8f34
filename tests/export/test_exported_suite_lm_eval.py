"""The synthetic suite under lm-evaluation-harness on an exported lenx run (trust_remote_code, offline),
against `lenx eval RUN --task` on the same instances.

The export's tokenizer is the corpus's: lenx reads its own ids, lm-eval the text decoded from them,
which the tokenizer may split otherwise where the haystack was cut inside a word. Where the text
gives back lenx's very ids, the answer's log-likelihood must be lenx's; exact match must agree on all."""

import os

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")  # lm-eval's hf model imports it

TASKS, LENGTHS, DEPTHS, SAMPLES = ("niah_single", "qa1"), [160], [0.0, 1.0], 2


@pytest.fixture(scope="module")
def both(run, exported, tmp_path_factory):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lenx.evaluation.suite_eval import evaluate_suite
    from lenx.evaluation.suite_export import export_settings, export_suite

    tasks = tmp_path_factory.mktemp("suite") / "tasks"
    settings = export_settings(like=run, lengths=LENGTHS)
    export_suite(tasks, ",".join(TASKS), settings, DEPTHS, SAMPLES)
    ours = evaluate_suite(run, ",".join(TASKS), lengths=LENGTHS, depths=DEPTHS, samples=SAMPLES, device="cpu",
                          progress=False, write=False)
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    before = {k: os.environ.get(k) for k in offline}
    os.environ.update(offline)
    try:
        theirs = simple_evaluate(model="hf", model_args=f"pretrained={exported},trust_remote_code=True,max_length=1024",
                                 tasks=["lenx_suite"], task_manager=TaskManager(include_path=str(tasks)),
                                 device="cpu", batch_size=1, log_samples=True, bootstrap_iters=0)
    finally:
        for k, v in before.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return settings, ours, theirs


def test_an_exported_run_scores_the_suite_under_lm_eval_as_lenx_does(both):
    from lenx.evaluation import suite

    settings, ours, theirs = both
    corpus, same = settings["corpus"], 0
    for t in TASKS:
        gen = {(s["doc"]["length"], s["doc"]["depth"], s["doc"]["index"]): s for s in theirs["samples"][f"lenx_{t}"]}
        ll = {(s["doc"]["length"], s["doc"]["depth"], s["doc"]["index"]): s
              for s in theirs["samples"][f"lenx_{t}_logprob"]}
        for a, L in enumerate(LENGTHS):
            for b, d in enumerate(DEPTHS):
                for i in range(SAMPLES):
                    assert gen[(L, d, i)]["exact"] == ours["tasks"][t]["exact_cases"][a][b][i], (t, L, d, i)
                    case = suite.build_case(corpus, t, L, d, i, settings["seed"], settings["split"])
                    if corpus.encode(gen[(L, d, i)]["doc"]["prompt"]) != case["input"].tolist():
                        continue   # the text splits into other tokens than lenx's (the module docstring)
                    same += 1
                    want = ours["tasks"][t]["logprob_cases"][a][b][i] * len(case["answer"])
                    assert ll[(L, d, i)]["logprob_sum"] == pytest.approx(want, abs=1e-3), (t, L, d, i)
    assert same >= 4   # half the instances or more read the same tokens: the comparison means something
