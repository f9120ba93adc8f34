"""scripts/repro for issue 44 part 2, the T 2048 recipe diagnosis: plan.py's recipe plan (ids, configs
that differ from the epoch plan's T 2048 run in one thing each, every recipe's seed 0 first), run_jobs.py
running solo jobs one at a time on one GPU, and collect_recipe.py setting a fake finished recipe run
against the committed handicapped T 2048 run, as a user runs them (subprocesses, another folder)."""

import importlib
import json
import os
from pathlib import Path
import shutil
import sys

import numpy as np
import pytest

from lenx.config import load_config, to_toml
from test_repro_epoch import REPRO, RESULTS, script, train_sets

STEPS = 3052


def recipe_plan(smoke: bool = False, rope: str = "") -> list[dict]:
    out = script("plan.py", "recipe", env={"REPRO_SMOKE": "1" if smoke else "0", "REPRO_RECIPE_ROPE": rope})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def resolved(cmd: str) -> dict:
    sets, _ = train_sets(cmd)
    return json.loads(json.dumps(load_config("125m", sets), default=vars))


def test_the_recipe_plan_changes_one_thing_of_the_t2048_recipe_each_seed_0_first():
    jobs = recipe_plan()
    assert [j["id"] for j in jobs] == [f"recipe/T2048/kerple-{r}-s{s}" for s in (0, 1)
                                       for r in ("warm10", "lr3e-4", "seqwarm10")]
    epoch = {j["id"]: j for j in json.loads(script("plan.py", "epoch", env={"REPRO_SMOKE": "0"}).stdout)}
    base = resolved(epoch["epoch/T2048/kerple-s0"]["cmd"])
    assert (base["train"]["lr"], base["train"]["warmup_frac"], base["train"]["seq_len_warmup"]) == (6e-4, 0.01, 0)
    changes = {"warm10": {("train", "warmup_frac"): 0.1},
               "lr3e-4": {("train", "lr"): 3e-4},
               "seqwarm10": {("train", "seq_len_start"): 512, ("train", "seq_len_warmup"): 305}}
    for job in jobs:
        name = Path(job["run"]).name
        recipe, seed = name.split("-", 1)[1].rsplit("-s", 1)
        assert job["kind"] == "solo" and job["run"] == f"runs/recipe/T2048/{name}"
        assert job["cmd"].endswith(f" && python3 -m lenx eval {job['run']} --no-progress && rm -rf {job['run']}/ckpt")
        cfg = resolved(job["cmd"])
        diff = {(s, k): v for s in cfg for k, v in cfg[s].items() if base[s][k] != v}
        assert diff == changes[recipe] | ({("train", "seed"): int(seed)} if seed != "0" else {})
        t = cfg["train"]
        assert t["steps"] * t["batch_size"] * t["seq_len"] == STEPS * 32768 and t["sampling"] == "pass"
    warm = load_config("125m", train_sets(jobs[0]["cmd"])[0]).train
    assert int(warm.warmup_frac * warm.steps) == 305  # lenx.training.optim.lr_at's warm-up steps

    rope = recipe_plan(rope="lr3e-4")
    assert rope[:-1] == jobs and rope[-1]["id"] == "recipe/T2048/rope-lr3e-4-s0"
    assert resolved(rope[-1]["cmd"])["model"]["method"] == "rope"
    bad = script("plan.py", "recipe", env={"REPRO_RECIPE_ROPE": "warm5"})
    assert bad.returncode != 0 and bad.stderr.strip() == ("plan.py: REPRO_RECIPE_ROPE is one of warm10, lr3e-4, "
                                                          "seqwarm10, got 'warm5'")
    smoke = recipe_plan(smoke=True)
    assert [j["id"] for j in smoke] == [j["id"] for j in jobs]
    for job in smoke:  # every command loads at toy sizes (the warm-up fits the smoke plan's 4 steps)
        cfg = load_config("125m", train_sets(job["cmd"])[0])
        assert (cfg.train.device, cfg.train.steps, cfg.model.n_layer) == ("cpu", 4, 2)


def test_per_position_is_one_switch_on_the_evaluation_only(monkeypatch):
    monkeypatch.syspath_prepend(str(REPRO))
    plan = importlib.import_module("plan")
    without = plan.recipe("warm10")
    monkeypatch.setattr(plan, "PER_POSITION", True)
    with_it = plan.recipe("warm10")
    for a, b in zip(without, with_it):
        assert b["cmd"] == a["cmd"].replace(" --no-progress && rm", " --no-progress --per-position && rm")
        assert b["cmd"].count("--per-position") == 1 and {**b, "cmd": a["cmd"]} == a


def test_solo_jobs_run_one_after_another_in_plan_order_on_one_gpu(tmp_path):
    jobs = [{"id": f"recipe/T2048/j{i}", "kind": "solo", "run": f"runs/j{i}",
             "cmd": f"date +%s.%N > runs/j{i}/start && sleep 0.3 && echo $CUDA_VISIBLE_DEVICES > runs/j{i}/gpu"
                    f" && date +%s.%N > runs/j{i}/end"} for i in range(4)]
    (tmp_path / "plan.json").write_text(json.dumps(jobs))
    (tmp_path / "done.txt").write_text("recipe/T2048/j1\n")
    out = script("run_jobs.py", "plan.json", "--gpus", "1", "--status", "runs/status.json", "--skip", "done.txt",
                 cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    ran = [0, 2, 3]
    spans = [(float((tmp_path / f"runs/j{i}/start").read_text()), float((tmp_path / f"runs/j{i}/end").read_text()))
             for i in ran]
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # in plan order, never two at once
    assert {(tmp_path / f"runs/j{i}/gpu").read_text().strip() for i in ran} == {"0"}
    assert not (tmp_path / "runs" / "j1").exists()


# --- the collector -----------------------------------------------------------------------------------

HANDICAPPED = RESULTS / "runs" / "T2048" / "kerple-s0"


def fake_recipe_run(folder: Path, recipe: str, seed: int, lag_removed: float, ppl_shift: float) -> Path:
    """The committed T2048/kerple-s0 as if trained with `recipe`: its training loss up to step 1000
    lowered by `lag_removed`, its window NLLs shifted by `ppl_shift` plus noise."""
    folder.mkdir(parents=True)
    cfg = load_config(str(HANDICAPPED / "config.toml"))
    cfg.train.seed = seed
    (folder / "config.toml").write_text(to_toml(cfg))
    for name in ("meta.json", "job.log"):
        shutil.copy(HANDICAPPED / name, folder / name)
    (folder / "command.txt").write_text(f"train {recipe} {seed}\n")
    records = [json.loads(line) for line in (HANDICAPPED / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        if r["step"] <= 1000:
            r["loss"] -= lag_removed
            if "val_loss" in r:
                r["val_loss"] -= lag_removed
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = json.loads((HANDICAPPED / "eval.json").read_text())
    rng = np.random.default_rng(seed)
    for r in result["results"].values():
        r["window_nll"] = [v + ppl_shift + 0.01 * rng.standard_normal() for v in r["window_nll"]]
    (folder / "eval.json").write_text(json.dumps(result | {"run": str(folder)}))
    return folder


@pytest.fixture
def recipe_trees(tmp_path):
    """here/results/epoch: the committed handicapped T 2048 Kerple and the two T 512 Kerple seeds;
    here/back/runs/recipe: a device tree with two finished recipe runs and one cut off."""
    here = tmp_path / "here"
    for part in ("runs/T2048/kerple-s0", "runs/T512/kerple-s0", "runs/T512/kerple-s1"):
        shutil.copytree(RESULTS / part, here / "results" / "epoch" / part)
    device = here / "back" / "runs" / "recipe"
    fake_recipe_run(device / "T2048" / "kerple-warm10-s0", "warm10", 0, 0.45, -0.1)
    fake_recipe_run(device / "T2048" / "kerple-warm10-s1", "warm10", 1, 0.40, -0.1)
    cut = fake_recipe_run(device / "T2048" / "kerple-lr3e-4-s0", "lr3e-4", 0, 0.1, 0.0)
    lines = (cut / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text("\n".join(lines[:20]) + "\n")  # the machine went back at step ~1000
    status = {"updated": 2e9, "jobs": [{"state": "done", "id": f"recipe/T2048/kerple-warm10-s{s}", "gpu": 0,
                                       "run": f"runs/recipe/T2048/kerple-warm10-s{s}", "seconds": 340.0 + s}
                                      for s in (0, 1)]}
    (device / "status.json").write_text(json.dumps(status))
    (device / "plan.json").write_text("[]")
    return here


def test_collect_recipe_sets_each_recipe_against_the_handicapped_run(recipe_trees):
    here = recipe_trees
    out = script("collect_recipe.py", "back/runs/recipe", "--session", "s21a", "--resamples", "200", cwd=here)
    assert out.returncode == 0, out.stderr
    res = here / "results" / "epoch" / "recipe"
    assert (res / "done.txt").read_text().split() == ["recipe/T2048/kerple-warm10-s0", "recipe/T2048/kerple-warm10-s1"]
    assert sorted(p.name for p in (res / "runs" / "T2048").iterdir()) == ["kerple-warm10-s0", "kerple-warm10-s1"]
    assert (res / "device" / "s21a" / "status.json").is_file()
    results = json.loads((res / "results.json").read_text())
    assert [(r["name"], r["recipe"], r["seed"]) for r in results["runs"]] == [("kerple-warm10-s0", "warm10", 0),
                                                                           ("kerple-warm10-s1", "warm10", 1)]
    assert results["runs"][1]["device_time"] == {"seconds": 341.0, "gpu": 0, "session": "s21a"}

    report = json.loads((res / "recipe.json").read_text())["methods"]["kerple"]
    curves = report["curves"]
    # the audit's table (science-2026-11-28.md section 3): Kerple T 2048 3.840 and T 512 3.365 over steps 100-500
    assert curves["kerple epoch"]["loss"]["100-500"] == pytest.approx(3.840, abs=5e-4)
    assert curves["kerple T 512 (epoch)"]["loss"]["100-500"] == pytest.approx(3.365, abs=5e-4)
    assert curves["kerple epoch"]["loss"]["550-1000"] == pytest.approx(2.852, abs=5e-4)
    for part, shift in (("100-500", 0.425), ("550-1000", 0.425), ("1050-1500", 0.0)):
        assert curves["kerple warm10"]["loss"][part] == pytest.approx(curves["kerple epoch"]["loss"][part] - shift)
    assert curves["kerple warm10"]["val_loss"]["500"] == pytest.approx(curves["kerple epoch"]["val_loss"]["500"] - 0.425)
    assert "kerple lr3e-4" not in curves  # cut off: not collected

    compared = report["compare"]
    assert compared["reference"] == "kerple epoch" and compared["methods"]["kerple warm10"]["seeds"] == [0, 1]
    assert compared["methods"]["kerple epoch"]["runs"] == ["../runs/T2048/kerple-s0"]
    diffs = compared["differences"]["kerple warm10"]
    assert set(diffs) == {"2048", "4096", "8192", "16384", "in_distribution"}
    assert all(diffs[L]["hi"] < 0 for L in ("2048", "4096", "8192", "16384"))  # NLL 0.1 lower on every window
    across = report["against_T512"]
    assert [(r["recipe"], r["length"], r["seeds"]) for r in across] == [("warm10", L, [2, 2])
                                                                        for L in (2048, 4096, 8192, 16384)]
    text = (res / "recipe.md").read_text()
    assert "| kerple epoch | 1 | 3.840 |" in text and "| kerple warm10 | 2 | 3.415 (-0.42) |" in text
    assert "| kerple warm10 s1 | 1 | 3.440 (-0.40) |" in text and "| kerple T 512 (epoch) | 2 | 3.365 (-0.48) |" in text
    assert "each recipe minus kerple trained at 512" in text

    before = {p: p.read_bytes() for p in res.rglob("*") if p.is_file()}
    again = script("collect_recipe.py", "results/epoch/recipe", "--resamples", "200", cwd=here)
    assert again.returncode == 0, again.stderr
    assert {p: p.read_bytes() for p in res.rglob("*") if p.is_file()} == before


def test_collect_recipe_refuses_bad_input_in_one_line_before_writing(recipe_trees):
    here = recipe_trees
    odd = here / "back" / "runs" / "recipe" / "T2048" / "kerple-s3"
    shutil.copytree(HANDICAPPED, odd)
    for args, message in [(("back/runs/recipe",), "1 device trees (back/runs/recipe) need as many --session names"),
                          (("nowhere",), "not a folder: nowhere"),
                          (("back", "--session", "x"), "neither a device tree"),
                          (("back/runs/recipe", "--session", "x", "--epoch", "back"), "holds no runs/T2048"),
                          (("back/runs/recipe", "--session", "x"), "not recipe runs at T 2048: back/runs/recipe/T2048/"
                                                                   "kerple-s3")]:
        out = script("collect_recipe.py", *args, cwd=here)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not (here / "results" / "epoch" / "recipe").exists()
