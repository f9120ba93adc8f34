"""Issue 44 part 4's plan (scripts/repro/plan.py verdict2): the newer methods and layouts at T 512 on
three seeds, seed 0 of every run first, each command a valid 125m configuration."""

import json
import re

from lenx.config import load_config

from test_repro_epoch import script

NAMES = ["fox", "ssmax-rope", "pope", "rnope-swa", "rope-p0.5", "dapev2-fox", "kerple-docmasked", "mta",
         "dapev2-kerple-docmasked"]


def test_the_plan_runs_every_method_s_seed_0_first_at_t512():
    out = script("plan.py", "verdict2")
    assert out.returncode == 0, out.stderr
    jobs = json.loads(out.stdout)
    assert [j["id"] for j in jobs] == [f"verdict2/T512/{n}-s{s}" for s in (0, 1, 2) for n in NAMES]
    for j in jobs:
        cmd = j["cmd"]
        assert j["run"] == "runs/verdict2/T512/" + j["id"].split("/")[-1] and j["kind"] == "solo"
        assert "train.seq_len=512" in cmd and "train.batch_size=64" in cmd and "eval.per_position=true" in cmd
        seed = j["id"][-1]
        assert f"train.seed={seed} " in cmd
        suite = f"lenx eval {j['run']} --task ruler --lengths 512,2048,16384 --samples 4"
        assert suite in cmd and "--task babilong" in cmd and cmd.index(suite) < cmd.index("rm -rf")
    by = {j["id"].split("/")[-1][:-3]: j["cmd"] for j in jobs}
    assert "model.layers=rnope-swa" in by["rnope-swa"] and "model.rope_fraction=0.5" in by["rope-p0.5"]
    assert all(("train.documents=masked" in c) == n.endswith("docmasked") for n, c in by.items())


def test_every_command_is_a_valid_configuration():
    """Each job's --set overrides load as a 125m config (a typo would cost a machine's time)."""
    jobs = json.loads(script("plan.py", "verdict2").stdout)
    for j in jobs[:len(NAMES)]:
        train = j["cmd"].split(" && ")[0]
        overrides = re.findall(r"--set (\S+)", train)
        cfg = load_config("125m", overrides)
        assert cfg.train.seq_len == 512 and cfg.train.batch_size == 64, j["id"]


def test_the_smoke_plan_runs_every_layout_on_a_model_it_divides():
    """REPRO_SMOKE=1 (toy sizes on a CPU, to try every command first): the layout's pattern of 4 layers
    gets 4 layers, the others 2, and every layout parses at that depth."""
    from lenx.attention.layouts import parse_layout

    jobs = json.loads(script("plan.py", "verdict2", env={"REPRO_SMOKE": "1"}).stdout)
    assert [j["id"] for j in jobs] == [f"verdict2/T512/{n}-s{s}" for s in (0, 1, 2) for n in NAMES]
    for j in jobs:
        cfg = load_config("125m", re.findall(r"--set (\S+)", j["cmd"].split(" && ")[0]))
        assert cfg.train.device == "cpu" and cfg.model.n_layer == (4 if cfg.model.layers else 2), j["id"]
        if cfg.model.layers:
            assert len(parse_layout(cfg.model.layers, cfg.model.n_layer)) == cfg.model.n_layer
