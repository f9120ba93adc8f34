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
                                       "recipe/T2048/kerple-s1", "recipe/T2048/rope-warm10-s0",
                                       "recipe/T512/kerple-warm10-s0", "recipe/T2048/rope-warm10-s1",
                                       "recipe/T512/kerple-warm10-s1", "recipe/T2048/kerple-lr3e-4-s1",
                                       "recipe/T2048/kerple-seqwarm10-s1"]
    for j in jobs:
        cmd, T = j["cmd"], j["id"].split("/")[1]
        batch = {"T2048": 16, "T512": 64}[T]
        assert f"train.seq_len={T[1:]}" in cmd and f"train.batch_size={batch}" in cmd and "eval.per_position=true" in cmd
        assert j["run"] == f"runs/recipe/{T}/" + j["id"].split("/")[-1] and j["kind"] == "solo"
        method = j["id"].split("/")[-1].split("-")[0]
        assert f"model.method={method} " in cmd
        # every run scores the suite before its checkpoint goes (issue 44 part 3)
        lengths = "2048,8192,16384" if T == "T2048" else "512,2048,16384"
        suite = f"lenx eval {j['run']} --task ruler --lengths {lengths} --samples 4"
        assert suite in cmd and "--task babilong" in cmd and cmd.index(suite) < cmd.index("rm -rf")
        name = j["id"].split("/")[-1]
        assert ("train.warmup_frac=0.1" in cmd) == ("warm10" in name and "seqwarm" not in name)
        assert ("train.lr=3e-4" in cmd) == ("lr3e-4" in name)
        assert ("train.seq_len_start=512" in cmd and "train.seq_len_warmup=305" in cmd) == ("seqwarm10" in name)


def test_the_committed_recipe_table_is_up_to_date(tmp_path):
    here = tmp_path / "recipe"
    shutil.copytree(RECIPE / "runs", here / "runs")
    out = script("recipe_t2048.py", "--out", "recipe", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "wrote recipe/recipe.md\n", out.stderr
    made = json.loads((here / "recipe.json").read_text())
    assert same_json(made, json.loads((RECIPE / "recipe.json").read_text())) == []
    assert same_text((here / "recipe.md").read_text(), (RECIPE / "recipe.md").read_text()) == []
    warm = made["recipes"]["kerple T2048 warm10"]["lengths"]["2048"]
    assert warm["minus epoch recipe"]["hi"] < 0 and warm["minus epoch recipe"]["covers"] == "seeds and documents"


def test_bad_sources_are_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    out = script("recipe_t2048.py", "elsewhere", "--session", "s", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == ("error: elsewhere is not a device tree of the recipe plan "
                                                  "(no T2048 or T512 folder)\n"), out.stderr
    out = script("recipe_t2048.py", "elsewhere", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == "error: give one --session per source\n"
    out = script("recipe_t2048.py", "--out", "nothing", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == "error: nothing has no runs yet\n"


def test_rope_and_t512_runs_get_their_own_epoch_recipe_rows(tmp_path):
    """The plan's checks beyond Kerple at 2048 (RoPE at 2048, Kerple at 512) each meet the epoch
    recipe of their own method and length (results/epoch's runs), and a T 2048 method the same method
    trained at 512. Stand-ins: copies of a committed run under the new names (the table reads only
    their files)."""
    here = tmp_path / "recipe"
    shutil.copytree(RECIPE / "runs", here / "runs")
    warm = RECIPE / "runs" / "T2048" / "kerple-warm10-s0"
    for stand_in in (here / "runs" / "T2048" / "rope-warm10-s0", here / "runs" / "T512" / "kerple-warm10-s1"):
        if not stand_in.exists():  # where the real run is committed, it stands for itself
            shutil.copytree(warm, stand_in)
    out = script("recipe_t2048.py", "--out", "recipe", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = json.loads((here / "recipe.json").read_text())["recipes"]
    assert rows["rope T2048 epoch recipe"]["runs"] == ["epoch/runs/T2048/rope-s0"]
    assert rows["rope T512 epoch recipe"]["seeds"] == 2 and rows["kerple T512 epoch recipe"]["seeds"] == 2
    rope = rows["rope T2048 warm10"]["lengths"]["2048"]
    assert rope["minus epoch recipe"]["covers"] == "documents only" and "minus T512" in rope  # one RoPE epoch seed
    t512 = rows["kerple T512 warm10"]["lengths"]["2048"]
    assert "minus epoch recipe" in t512 and "minus T512" not in t512
    # a T 2048 recipe also meets the same method at 512 with the same recipe, where that ran
    assert "minus T512 same recipe" in rows["kerple T2048 warm10"]["lengths"]["2048"]
    assert "minus T512 same recipe" not in rope
    md = (here / "recipe.md").read_text()
    assert "| rope T2048 warm10 |" in md and "| kerple T512 warm10 |" in md
