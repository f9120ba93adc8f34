"""Issue 44's T 2048 recipe diagnosis: the plan (scripts/repro/plan.py recipe) and its table
(scripts/repro/recipe_t2048.py); the committed results/recipe tables are what the script makes of the
committed runs."""

import json
import shutil

from _compare import same_json, same_text
from test_repro_epoch import RESULTS, script

RECIPE = RESULTS.parent / "recipe"


def test_the_plan_runs_seed_0_of_every_recipe_first():
    out = script("plan.py", "recipe")
    assert out.returncode == 0, out.stderr
    jobs = json.loads(out.stdout)
    assert [j["id"] for j in jobs] == ["recipe/T2048/kerple-warm10-s0", "recipe/T2048/kerple-lr3e-4-s0",
                                       "recipe/T2048/kerple-seqwarm10-s0", "recipe/T2048/kerple-warm10-s1",
                                       "recipe/T2048/kerple-lr3e-4-s1", "recipe/T2048/kerple-seqwarm10-s1",
                                       "recipe/T2048/kerple-s1"]
    for j in jobs:
        cmd = j["cmd"]
        assert "train.seq_len=2048" in cmd and "train.batch_size=16" in cmd and "eval.per_position=true" in cmd
        assert j["run"] == "runs/recipe/T2048/" + j["id"].split("/")[-1] and j["kind"] == "solo"
        # every run scores the suite before its checkpoint goes (issue 44 part 3)
        suite = f"lenx eval {j['run']} --task ruler --lengths 2048,8192,16384 --samples 4"
        assert suite in cmd and "--task babilong" in cmd and cmd.index(suite) < cmd.index("rm -rf")
    assert "train.warmup_frac=0.1" in jobs[0]["cmd"] and "train.lr=3e-4" not in jobs[0]["cmd"]
    assert "train.lr=3e-4" in jobs[1]["cmd"] and "warmup_frac" not in jobs[1]["cmd"]
    assert "train.seq_len_start=512" in jobs[2]["cmd"] and "train.seq_len_warmup=305" in jobs[2]["cmd"]
    assert "warmup_frac" not in jobs[2]["cmd"] and "train.lr=" not in jobs[2]["cmd"]
    assert "warmup_frac" not in jobs[6]["cmd"] and "train.lr" not in jobs[6]["cmd"] and "seq_len_start" not in jobs[6]["cmd"]


def test_the_committed_recipe_table_is_up_to_date(tmp_path):
    here = tmp_path / "recipe"
    shutil.copytree(RECIPE / "runs", here / "runs")
    out = script("recipe_t2048.py", "--out", "recipe", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "wrote recipe/recipe.md\n", out.stderr
    made = json.loads((here / "recipe.json").read_text())
    assert same_json(made, json.loads((RECIPE / "recipe.json").read_text())) == []
    assert same_text((here / "recipe.md").read_text(), (RECIPE / "recipe.md").read_text()) == []
    warm = made["recipes"]["kerple-warm10"]["lengths"]["2048"]
    assert warm["minus epoch recipe"]["hi"] < 0 and warm["minus epoch recipe"]["covers"] == "documents only"


def test_bad_sources_are_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    out = script("recipe_t2048.py", "elsewhere", "--session", "s", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == ("error: elsewhere is not a device tree of the recipe plan "
                                                  "(no T2048 folder)\n"), out.stderr
    out = script("recipe_t2048.py", "elsewhere", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == "error: give one --session per source\n"
    out = script("recipe_t2048.py", "--out", "nothing", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == "error: nothing has no runs yet\n"
