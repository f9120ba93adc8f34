"""Issue 44's verdict2 plan (scripts/repro/plan.py verdict2): the newer methods and layouts at T 512
and the epoch verdict's five methods at T 512 and 2048, all with the adopted recipe (warm10) on three
seeds, seed 0 of every run first, each command a valid 125m configuration; the recipe plan's runs
that are exactly a verdict2 job are reused, not run again."""

import json
import re

import pytest

from lenx.config import load_config

from test_repro_epoch import REPRO, script

NAMES = ["fox", "ssmax-rope", "pope", "rnope-swa", "rope-p0.5", "dapev2-fox", "kerple-docmasked", "mta",
         "dapev2-kerple-docmasked"]
FIVE = ["rope", "kerple", "stickbreaking", "dape-kerple", "dapev2-kerple"]
REUSED = {"T512/kerple-s0": "T512/kerple-warm10-s0", "T512/kerple-s1": "T512/kerple-warm10-s1",
          "T2048/kerple-s1": "T2048/kerple-warm10-s1",
          "T2048/rope-s0": "T2048/rope-warm10-s0", "T2048/rope-s1": "T2048/rope-warm10-s1"}
RECIPE_RUNS = REPRO.parents[1] / "results" / "recipe" / "runs"


def planned_ids() -> list[str]:
    """Seed-major; in each seed the five at 512, the newer runs, the five at 2048; the reused left out."""
    ids = [f"T{T}/{n}-s{s}" for s in (0, 1, 2) for T, names in ((512, FIVE + NAMES), (2048, FIVE)) for n in names]
    return [f"verdict2/{i}" for i in ids if i not in REUSED]


@pytest.fixture
def plans(monkeypatch):
    """plan.py as a module (scripts/repro on the path, as the scripts import each other)."""
    monkeypatch.syspath_prepend(str(REPRO))
    import plan
    return plan


def test_the_plan_runs_every_method_s_seed_0_first_with_warm10():
    out = script("plan.py", "verdict2")
    assert out.returncode == 0, out.stderr
    jobs = json.loads(out.stdout)
    assert [j["id"] for j in jobs] == planned_ids() and len(jobs) == 52
    for j in jobs:
        cmd, T = j["cmd"], int(j["id"].split("/")[1][1:])
        assert j["run"] == "runs/verdict2/" + j["id"].removeprefix("verdict2/") and j["kind"] == "solo"
        assert f"train.seq_len={T}" in cmd and f"train.batch_size={32768 // T}" in cmd
        assert "train.warmup_frac=0.1" in cmd and "eval.per_position=true" in cmd  # the adopted recipe
        assert f"train.seed={j['id'][-1]} " in cmd
        suite = f"lenx eval {j['run']} --task ruler --lengths {T},{4 * T},16384 --samples 4"
        assert suite in cmd and "--task babilong" in cmd and cmd.index(suite) < cmd.index("rm -rf")
    by = {j["id"].removeprefix("verdict2/")[:-3]: j["cmd"] for j in jobs}
    assert "model.layers=rnope-swa" in by["T512/rnope-swa"] and "model.rope_fraction=0.5" in by["T512/rope-p0.5"]
    assert all(("train.documents=masked" in c) == n.endswith("docmasked") for n, c in by.items())
    assert all(f"model.method={n.split('/')[1]} " in by[n] for n in by if n.split("/")[1] in FIVE)


def test_the_verdict_recipe_is_warm10(plans):
    assert plans.VERDICT_RECIPE == plans.RECIPES["warm10"] == ("train.warmup_frac=0.1",)


def test_the_reused_recipe_runs_are_exactly_their_verdict2_jobs(plans):
    """Each reused run's command, as it ran (its committed command.txt) and as the recipe plan gives it,
    is the verdict2 job's but for its folder, and its config has the planned identity, recipe included."""
    import claims_plans

    assert plans.VERDICT_REUSED == REUSED
    jobs = {j["id"].removeprefix("verdict2/"): j for j in plans.verdict2_jobs()}
    recipe = {j["id"].removeprefix("recipe/"): j for j in plans.recipe()}
    for mine, theirs in REUSED.items():
        ran = (RECIPE_RUNS / theirs / "command.txt").read_text().strip()
        assert ran == recipe[theirs]["cmd"]
        assert ran.replace(recipe[theirs]["run"], jobs[mine]["run"]) == jobs[mine]["cmd"], mine
        cfg = load_config(str(RECIPE_RUNS / theirs / "config.toml"))
        assert claims_plans.identity(cfg) == claims_plans.identity(claims_plans.job_config(jobs[mine]))
        assert cfg.train.warmup_frac == 0.1
    # Kerple's seed 0 at 2048 ran before the suite was part of the job: not the same command, so run again
    ran = (RECIPE_RUNS / "T2048" / "kerple-warm10-s0" / "command.txt").read_text()
    assert "--task" not in ran and "--task ruler" in jobs["T2048/kerple-s0"]["cmd"]
    assert "verdict2/T2048/kerple-s0" in {j["id"] for j in plans.verdict2()}
    assert not {f"verdict2/{i}" for i in REUSED} & {j["id"] for j in plans.verdict2()}


def test_every_command_is_a_valid_configuration():
    """Each job's --set overrides load as a 125m config (a typo would cost a machine's time)."""
    jobs = json.loads(script("plan.py", "verdict2").stdout)
    for j in jobs[:len(FIVE + NAMES) + len(FIVE) - 1]:
        cfg = load_config("125m", re.findall(r"--set (\S+)", j["cmd"].split(" && ")[0]))
        assert cfg.train.seq_len * cfg.train.batch_size == 32768 and cfg.train.warmup_frac == 0.1, j["id"]


def test_the_smoke_plan_runs_every_layout_on_a_model_it_divides():
    """REPRO_SMOKE=1 (toy sizes on a CPU, to try every command first): the layout's pattern of 4 layers
    gets 4 layers, the others 2, and every layout parses at that depth."""
    from lenx.attention.layouts import parse_layout

    jobs = json.loads(script("plan.py", "verdict2", env={"REPRO_SMOKE": "1"}).stdout)
    assert [j["id"] for j in jobs] == planned_ids()
    for j in jobs:
        cfg = load_config("125m", re.findall(r"--set (\S+)", j["cmd"].split(" && ")[0]))
        assert cfg.train.device == "cpu" and cfg.model.n_layer == (4 if cfg.model.layers else 2), j["id"]
        if cfg.model.layers:
            assert len(parse_layout(cfg.model.layers, cfg.model.n_layer)) == cfg.model.n_layer
