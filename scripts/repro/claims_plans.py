"""The plans a claims table is checked against, and how each finds its runs (claims_epoch.py --plan).

A plan is {training length: {"lengths": the lengths lenx eval scores, "runs": {method: [planned run
names]}}}, from plan.py's jobs:
  epoch     plan.py's epoch plan at T 128, 512 and 2048; a method is collect.label of its config, and
            its runs are whatever <results>/runs/T<T> holds.
  verdict2  plan.py's verdict2 plan (issue 44 parts 2 and 4): the newer methods at T 512 beside the
            epoch verdict's five methods trained with the same recipe (warm10) at T 512 and 2048. A
            method is its run's name without the seed, since several share a model.method
            (rnope-swa and rope-p0.5 are RoPE, kerple-docmasked is Kerple). Its runs are read from
            the verdict2 tree, but for the recipe plan's runs it reuses (plan.py VERDICT_REUSED),
            read from the recipe tree (--baselines). Only the planned run folders are read, and each
            must hold its planned configuration, recipe included ("folders", "shown", "expected" in
            the plan's entry, each keyed by (method, run name)).
"""

import os
from pathlib import Path
import re
import shlex

from collect import label, load_run as load_finished
from plan import VERDICT_REUSED, epoch, verdict2_jobs

from lenx.config import load_config
from lenx.evaluation.evaluate import default_lengths
from lenx.report.compare import CompareError, load_run

PLANS = ("epoch", "verdict2")
# what tells the planned runs apart: a folder holding another configuration is not that run
IDENTITY = (("model", "method"), ("model", "layers"), ("model", "rope_fraction"), ("model", "dape_hidden"),
            ("train", "documents"), ("train", "seq_len"), ("train", "seed"),
            ("train", "warmup_frac"), ("train", "lr"), ("train", "seq_len_start"))  # the recipe (plan.py RECIPES)


def job_config(job: dict):
    """The config of a plan job's `lenx train` command."""
    words = shlex.split(job["cmd"].split(" && ")[0])
    return load_config("125m", [words[i + 1] for i, w in enumerate(words) if w == "--set"])


def identity(cfg) -> dict:
    return {f"{section}.{key}": getattr(getattr(cfg, section), key) for section, key in IDENTITY}


def epoch_plan() -> dict[int, dict]:
    """train_len -> {"lengths": the evaluated lengths, "runs": {label: [planned run names]}}, from
    plan.py's epoch plan."""
    out = {}
    for job in epoch():
        cfg = job_config(job)
        T = cfg.train.seq_len
        name = label({"model": {"method": cfg.model.method, "dape_hidden": cfg.model.dape_hidden}})
        entry = out.setdefault(T, {"lengths": default_lengths(T, cfg.eval.max_length, cfg.eval.scored), "runs": {}})
        entry["runs"].setdefault(name, []).append(Path(job["run"]).name)
    return out


def verdict2_plan(results: Path, baselines: Path) -> dict[int, dict]:
    """The verdict2 plan's runs at each training length, under results/runs/T<T>, or for a reused
    recipe run under baselines/runs (the recipe tree), each entry also with "folders" {(method, run
    name): its folder}, "shown" {(method, run name): that folder relative to results, for the missing
    runs' names} and "expected" {(method, run name): identity of its planned config}."""
    out = {}
    for job in verdict2_jobs():
        cfg = job_config(job)
        T, name = cfg.train.seq_len, Path(job["run"]).name
        method = re.sub(r"-s\d+$", "", name)
        reused = VERDICT_REUSED.get(f"T{T}/{name}")
        folder = baselines / "runs" / reused if reused else results / "runs" / f"T{T}" / name
        entry = out.setdefault(T, {"lengths": default_lengths(T, cfg.eval.max_length, cfg.eval.scored), "runs": {},
                                   "folders": {}, "shown": {}, "expected": {}})
        entry["runs"].setdefault(method, []).append(name)
        entry["folders"][method, name] = folder
        entry["shown"][method, name] = os.path.relpath(folder, results)
        entry["expected"][method, name] = identity(cfg)
    return out


def checked_groups(groups: dict, T: int) -> dict:
    """{label: runs} in seed order; a CompareError when two runs were evaluated on other windows, or one
    method has a seed twice."""
    first = next((runs[0] for runs in groups.values()), None)
    for method, runs in groups.items():
        other = [r["run"] for r in runs if r["windows"] != first["windows"]]
        if other:
            raise CompareError(f"runs evaluated on other windows than {first['run']}: {', '.join(other)}")
        seeds = [r["seed"] for r in runs]
        if len(set(seeds)) != len(seeds):
            raise CompareError(f"two {method} runs at T {T} have the same training seed: {', '.join(r['run'] for r in runs)}")
        runs.sort(key=lambda r: r["seed"])
    return groups


def load_planned(entry: dict, T: int) -> dict:
    """{method: [compare.load_run of each finished planned run]} of a plan entry with "folders"; a
    CompareError when a planned folder holds another configuration than the plan's."""
    groups = {}
    for method, names in entry["runs"].items():
        for name in names:
            run = entry["folders"][method, name]
            r = load_finished(run) if (run / "config.toml").is_file() else None
            if r is None or not r["results"]:
                continue
            want, got = entry["expected"][method, name], identity(load_config(str(run / "config.toml")))
            odd = [f"{key} = {got[key]!r} (planned {want[key]!r})" for key in want if got[key] != want[key]]
            if odd:
                raise CompareError(f"{run} is not the planned {name}: its config has {', '.join(odd)}")
            groups.setdefault(method, []).append(load_run(run, method))
    return checked_groups(groups, T)
