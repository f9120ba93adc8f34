"""`lenx suite-export`: the synthetic suite's instances (lenx.evaluation.suite) as a task folder for
lm-evaluation-harness (`lm_eval --include_path DIR`), which runs with no download.

Per suite task T the folder holds T.jsonl (one row per instance: the input decoded to text from
lenx's tokens, the answer and " " + answer, the length, depth and index, the task's instances
hash), lenx_T.yaml (greedy generation, scored "exact" as lenx scores it: the stripped continuation
starts with the answer) and lenx_T_logprob.yaml (the log-likelihood of " " + answer given the
input: "logprob_sum" in nats, "logprob_per_byte" and "greedy"). Both also report the score per
length (exact_<L>, logprob_per_byte_<L>). lenx_suite.py loads the JSONL beside it (after checking
its SHA-256 against lenx_suite.json) and scores the answers; lenx_suite.json records the corpus
fingerprint, the generator versions, seed, split, grid and every task's instances hash: the hash
that `lenx eval --task` writes for the same grid. Every task carries the tag lenx_suite.
"""

import hashlib
import json
import os
from pathlib import Path
import shutil

from ..config import ConfigError, EvalConfig
from ..fileio import OutputError, check_writable_dir, write_json, write_text, written_by
from . import suite

MARKER = "lenx suite-export"
MANIFEST = "lenx_suite.json"

GENERATE = """# lenx suite task {task} (docs/suite.md): greedy continuation, "exact" as lenx scores it
task: lenx_{task}
tag: [lenx_suite]
custom_dataset: !function lenx_suite.load
dataset_kwargs:
  lenx_task: {task}
test_split: test
output_type: generate_until
doc_to_text: prompt
doc_to_target: answer
target_delimiter: ""
process_results: !function lenx_suite.exact
metric_list:
{metrics}
generation_kwargs:
  until: []
  do_sample: false
  max_gen_toks: {max_gen_toks}
metadata:
  version: {version}
"""
LOGPROB = """# lenx suite task {task} (docs/suite.md): the answer's log-likelihood given the input
task: lenx_{task}_logprob
tag: [lenx_suite]
custom_dataset: !function lenx_suite.load
dataset_kwargs:
  lenx_task: {task}
test_split: test
output_type: loglikelihood
doc_to_text: prompt
doc_to_target: continuation
target_delimiter: ""
process_results: !function lenx_suite.logprob
metric_list:
{metrics}
metadata:
  version: {version}
"""
CODE = '''"""What the lenx_* tasks of this folder share (written by `lenx suite-export`): the loader of their
instances and their scores. Needs only the standard library and `datasets` (lm-eval's own)."""

import hashlib
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(lenx_task=None, **_):
    """The instances of one task, checked against the SHA-256 that lenx_suite.json records."""
    import datasets

    path = HERE / f"{lenx_task}.jsonl"
    data = path.read_bytes()
    want = json.loads((HERE / "lenx_suite.json").read_text())["tasks"][lenx_task]["jsonl_sha256"]
    if hashlib.sha256(data).hexdigest() != want:
        raise ValueError(f"{path} is not the file lenx suite-export wrote (its SHA-256 differs); export it again")
    rows = [json.loads(line) for line in data.decode("utf-8").splitlines()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def exact(doc, results):
    """lenx's exact match: the greedy continuation, stripped, starts with the answer."""
    score = float(results[0].strip().startswith(doc["answer"]))
    return {"exact": score, f"exact_{doc['length']}": score}


def logprob(doc, results):
    """The log-likelihood of the continuation (" " + answer; nats, summed over the model's tokens),
    per byte of it, and whether greedy decoding would give it."""
    ll, greedy = results[0]
    per_byte = ll / len(doc["continuation"].encode("utf-8"))
    return {"logprob_sum": ll, "logprob_per_byte": per_byte, "greedy": float(greedy),
            f"logprob_per_byte_{doc['length']}": per_byte}
'''


def _metrics(names: list[str]) -> str:
    return "\n".join(f"  - metric: {n}\n    aggregation: mean\n    higher_is_better: true" for n in names)


def export_settings(like=None, corpus=None, data_root=None, lengths=None) -> dict:
    """The corpus, split, seed and lengths of the instances: those `lenx eval LIKE --task` uses (the
    run's corpus, checked to be the one it was trained on, eval.split, eval.seed and its default
    lengths), or, with `corpus`, those of `lenx eval --hf DIR --corpus NAME --task` (lenx's eval
    defaults; the lengths must be given)."""
    from ..data import open_corpus

    if (like is None) == (corpus is None):
        raise ConfigError("give the instances' corpus: --like RUN (a lenx run's corpus, split, seed and lengths) "
                          "or --corpus NAME (a prepared corpus, with --lengths), one of them")
    if like is not None:
        if data_root is not None:
            raise ConfigError("--data-root belongs to --corpus; --like takes the corpus from the run")
        from ..runs import open_run_corpus, run_config
        from .evaluate import default_lengths

        cfg = run_config(like)
        e = cfg.eval
        found = open_run_corpus(like, cfg)
        lengths = lengths or e.lengths or default_lengths(cfg.train.seq_len, e.max_length)
        split, seed = e.split, e.seed
    else:
        if not lengths:
            raise ConfigError("--corpus needs --lengths (the input lengths, in the corpus's tokens)")
        found = open_corpus(corpus, Path(data_root or "data"))
        split, seed = EvalConfig().split, EvalConfig().seed
    if found.tokenizer() is None:
        raise ConfigError(f"corpus {found.name!r} is token-level: lm-eval reads text, so its token-level suite "
                          "runs only in `lenx eval RUN --task`")
    return {"corpus": found, "split": split, "seed": seed, "lengths": sorted(set(lengths))}


def check_target(out: Path, force: bool) -> None:
    """OUT must be new, an empty folder, or (with force) an earlier suite export; writable."""
    out = Path(out)
    check_writable_dir(out, "the task folder")
    check_writable_dir(out.absolute().parent, "the folder of the task folder")
    if out.is_dir() and any(out.iterdir()):
        if not written_by(out / MANIFEST, MARKER, {"tasks", "corpus_fingerprint"}):
            raise OutputError(f"{out} is a folder that holds other files: give lenx suite-export a new or empty folder")
        if not force:
            raise OutputError(f"{out} holds an earlier lenx suite-export: --force replaces it")


def _rows(corpus, task, lengths, depths, samples, seed, split) -> tuple[list[dict], str]:
    cases = [(L, d, i, suite.build_case(corpus, task, L, d, i, seed, split))
             for L in lengths for d in depths for i in range(samples)]
    digest = suite.instances_hash([c for *_, c in cases])   # run_suite's order: lengths, depths, instances
    # "continuation": what lenx appends to the input to score the answer (lm-eval adds no space itself)
    rows = [{"task": task, "length": L, "depth": d, "index": i, "prompt": corpus.decode(c["input"].tolist()),
             "answer": c["answer_text"], "continuation": " " + c["answer_text"], "instances": digest}
            for L, d, i, c in cases]
    return rows, digest


def export_suite(out: Path, task: str, settings: dict, depths, samples: int, force: bool = False) -> dict:
    """Write the task folder `out` (the module docstring) for the suite tasks of `task` on
    settings' lengths x `depths`; every instance is built (and checked) before anything is written,
    and the folder is built aside and moved into place at the end. Returns the manifest."""
    out = Path(out)
    tasks = suite.parse_tasks(task)
    corpus, split, seed, lengths = (settings[k] for k in ("corpus", "split", "seed", "lengths"))
    check_target(out, force)
    built = {t: _rows(corpus, t, lengths, depths, samples, seed, split) for t in tasks}
    manifest = {"written_by": MARKER, "corpus": corpus.name, "corpus_fingerprint": corpus.fingerprint(),
                "generator_version": suite.VERSION, "seed": seed, "split": split, "lengths": lengths,
                "depths": list(depths), "samples": samples, "tasks": {}}
    parent = out.absolute().parent
    tmp = parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)   # left by an export that was killed
    try:
        tmp.mkdir(parents=True)
        for t, (rows, digest) in built.items():
            data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
            (tmp / f"{t}.jsonl").write_bytes(data)
            # lenx generates the answer's tokens + 2; a token holds at least one byte, so this bound is never shorter
            longest = max(len(r["continuation"].encode("utf-8")) for r in rows) + 2
            common = {"task": t, "version": suite.VERSION[_group(t)]}
            write_text(tmp / f"lenx_{t}.yaml", GENERATE.format(
                **common, max_gen_toks=longest, metrics=_metrics(["exact"] + [f"exact_{L}" for L in lengths])))
            write_text(tmp / f"lenx_{t}_logprob.yaml", LOGPROB.format(**common, metrics=_metrics(
                ["logprob_sum", "logprob_per_byte", "greedy"] + [f"logprob_per_byte_{L}" for L in lengths])))
            manifest["tasks"][t] = {"instances": digest, "count": len(rows), "max_gen_toks": longest,
                                    "jsonl_sha256": hashlib.sha256(data).hexdigest()}
        write_text(tmp / "lenx_suite.py", CODE)
        write_json(tmp / MANIFEST, manifest)
        old = parent / f".{out.name}.old-{os.getpid()}"
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _group(task: str) -> str:
    return next(g for g, names in suite.GROUPS.items() if task in names)
