"""`lenx eval --hf DIR --task ruler|babilong|<names>`: the synthetic suite on a transformers model. The
inputs are the runs' (lengths in the corpus's tokens), read as text in the model's tokens."""

from pathlib import Path

import numpy as np

from . import suite
from .hf import quiet
from .hf_eval import _bar, _Prepared, check_output
from .suite_eval import DEPTHS, file_task


def _score(reader, convert, budget):
    import torch

    from ..model.generate import generate

    def score(_, case) -> tuple[float, float]:
        ids = convert.convert(case["input"]).ids
        answer = convert.encode(" " + case["answer_text"])
        nll = reader.read([np.concatenate([ids, answer])], [len(ids)], budget)[0][0]
        prompt = torch.from_numpy(ids)[None].to(reader.device)
        with quiet():
            new = generate(reader, prompt, len(answer) + 2, temperature=0)["tokens"][0]
        return float(convert.decode(new.tolist()).strip().startswith(case["answer_text"])), \
            -float(nll.astype(np.float64).mean())
    return score


def evaluate_hf_suite(model_dir: Path, task: str, corpus=None, data_root=None, like=None, out=None, name=None,
                      lengths=None, depths=None, samples=None, train_len=None, device="auto", progress=True,
                      write=True) -> dict:
    tasks, name_ = suite.parse_tasks(task), file_task(task)
    depths = list(DEPTHS if depths is None else depths)
    if not depths or any(not 0 <= d <= 1 for d in depths):
        from ..config import ConfigError

        raise ConfigError(f"depths must be numbers in [0, 1], got {depths!r}")
    p = _Prepared(model_dir, out, name, device, task=name_, corpus=corpus, data_root=data_root, like=like,
                  lengths=lengths, train_len=train_len)
    s, samples = p.settings, samples or 8
    file_name = f"eval_{name_}.json"
    if write:
        check_output(p.out, file_name)
    inputs = [suite.build_case(p.corpus, t, L, d, i, s["eval_seed"], s["split"])["input"]
              for t in tasks for L in s["lengths"] for d in depths for i in range(samples)]
    # the longest input with room for an answer and the tokens generated after it
    reader = p.load([np.append(p.convert.convert(x).ids, np.zeros(24, dtype=np.int64)) for x in inputs])
    budget = 65536 if p.device.type == "cuda" else 8192
    bar = _bar(progress, len(tasks) * len(s["lengths"]) * len(depths), f"{name_} {p.name}")
    grid = suite.run_suite(reader, p.corpus, tasks, s["lengths"], depths, samples, s["eval_seed"], s["split"],
                           score=_score(reader, p.convert, budget),
                           progress=None if bar is None else (lambda *_: bar.update(1)))
    if bar is not None:
        bar.close()
    result = p.header(reader) | grid | {"task": name_}
    if write:
        p.write(file_name, result)
    return result
