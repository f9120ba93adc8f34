"""scripts/repro/claims_epoch.py --plan verdict2: results/verdict2/claims.toml names only methods and
lengths of plan.py's verdict2 plan at T 512 (the newer methods and the epoch verdict's five, all with
the warm10 recipe); on fabricated finished runs (results/verdict2/runs/T512, and the recipe run the plan
reuses under results/recipe/runs/T512, in a temporary folder, as a user's tree) every claim gets a
verdict and claims.md / claims.json are written; a malformed claim, a folder holding another run's
config (another recipe included) or a bad option is a one-line error before anything is written."""

import json
from pathlib import Path
import re
import shutil
import tomllib

import pytest

from lenx.config import load_config, to_toml
from test_repro_epoch import REPRO, fake_run, script, train_sets

CLAIMS = REPRO.parents[1] / "results" / "verdict2" / "claims.toml"
LENGTHS = [512, 1024, 2048, 4096, 8192, 16384]
FIVE = ("rope", "kerple", "dape-kerple", "dapev2-kerple", "stickbreaking")
VERDICTS = {"confirmed", "contradicted", "inconclusive"}


def plan(name: str) -> list[dict]:
    out = script("plan.py", name)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def verdict2_methods() -> dict[str, list[str]]:
    """The verdict2 plan's methods at T 512 (run names without the seed) -> the --set overrides of the
    first seed it runs (the seed's own setting aside, all seeds have the same)."""
    out = {}
    for job in plan("verdict2"):
        if "/T512/" in job["run"]:
            out.setdefault(Path(job["run"]).name[:-3], train_sets(job["cmd"])[0])
    return out


IDENTIFYING = ("model.layers", "model.rope_fraction", "train.documents", "train.warmup_frac")


def planned_sets(overrides: list[str]) -> tuple[str, tuple]:
    """(model.method, the settings of `IDENTIFYING` a run folder must hold) of a job's overrides."""
    method = next(s.split("=")[1] for s in overrides if s.startswith("model.method="))
    return method, tuple(s for s in overrides if s.split("=")[0] in IDENTIFYING)


def test_every_verdict2_claim_names_planned_methods_and_lengths():
    data = tomllib.loads(CLAIMS.read_text())
    methods = set(verdict2_methods()) - set(FIVE)
    assert methods == {"fox", "ssmax-rope", "pope", "rnope-swa", "rope-p0.5", "dapev2-fox", "kerple-docmasked", "mta",
                       "dapev2-kerple-docmasked"}
    at_512 = {train_sets(j["cmd"])[0][0].split("=")[1] for j in plan("epoch") if "train.seq_len=512" in j["cmd"]}
    assert at_512 == set(FIVE) <= set(verdict2_methods())  # the epoch verdict's five, run again with warm10
    for claim in data["claim"]:
        assert claim["train_len"] == 512, claim["id"]
        assert claim["a"] in methods, claim["id"]  # every claim is about a newer method or layout
        assert claim.get("b", claim["a"]) in methods | at_512, claim["id"]
        spec = claim.get("lengths", [])
        assert spec == "every length >= 2T" or set(spec) <= set(LENGTHS), claim["id"]
        assert claim.get("b_length", 512) in LENGTHS, claim["id"]
        assert re.search(r"arXiv \d{4}\.\d{5}", claim["paper"] + claim["evidence"]), claim["id"]
    tested = {c["a"] for c in data["claim"]}
    assert tested == methods  # each verdict2 run is the subject of a claim
    untested = data["untested"]
    assert untested and all(u["why"] and u["report"] for u in untested)
    assert not {c["id"] for c in data["claim"]} & {u["id"] for u in untested}


def fabricate(folder: Path, method: str, seed: int, shift: float, sets: tuple = (), inside: float = 0.0,
              seq_len: int = 512) -> Path:
    """fake_run at T seq_len with the planned settings (`sets`: key=value of IDENTIFYING) and its
    in-distribution NLLs shifted by `inside`."""
    fake_run(folder, method, seed, shift, seq_len=seq_len)
    cfg = load_config(str(folder / "config.toml"))
    for setting in sets:
        key, value = setting.split("=")
        section, name = key.split(".")
        setattr(getattr(cfg, section), name, float(value) if name in ("rope_fraction", "warmup_frac") else value)
    (folder / "config.toml").write_text(to_toml(cfg))
    result = json.loads((folder / "eval.json").read_text())
    result["in_distribution"]["window_nll"] = [v + inside for v in result["in_distribution"]["window_nll"]]
    (folder / "eval.json").write_text(json.dumps(result))
    return folder


SHIFTS = {"fox": (-0.3, -0.3), "pope": (0.3, 0.3), "mta": (0.0, -0.3), "rnope-swa": (0.0, 0.0)}


REUSED_KERPLE = Path("recipe") / "runs" / "T512" / "kerple-warm10-s0"  # plan.py VERDICT_REUSED's at T 512
REUSED_KERPLE_S1 = REUSED_KERPLE.with_name("kerple-warm10-s1")


@pytest.fixture
def trees(tmp_path):
    """results/verdict2 with two seeds of every verdict2 method at T 512 but stick-breaking (FoX 0.3
    nats below RoPE everywhere, PoPE 0.3 above, MTA 0.3 below in distribution only, one seed of
    rnope-swa), Kerple's seeds 0 and 1 being results/recipe's kerple-warm10-s0 and -s1, which the plan
    reuses."""
    res = tmp_path / "results"
    for name, overrides in verdict2_methods().items():
        if name == "stickbreaking":
            continue
        method, extra = planned_sets(overrides)
        shift, inside = SHIFTS.get(name, (0.01, 0.01))
        for seed in (0,) if name == "rnope-swa" else (0, 1):
            reused = {("kerple", 0): REUSED_KERPLE, ("kerple", 1): REUSED_KERPLE_S1}.get((name, seed))
            folder = res / reused if reused else res / "verdict2" / "runs" / "T512" / f"{name}-s{seed}"
            fabricate(folder, method, seed, shift + 0.002 * seed, extra, inside)
    (res / "verdict2" / "claims.toml").write_text(CLAIMS.read_text())
    return tmp_path, res


def run_claims(cwd: Path, *args: str):
    return script("claims_epoch.py", "--plan", "verdict2", "--resamples", "100", *args, cwd=cwd)


def test_every_claim_gets_a_verdict_on_fabricated_runs(trees):
    cwd, res = trees
    out = run_claims(cwd)  # --results defaults to results/verdict2, --baselines to results/epoch
    assert out.returncode == 0, out.stderr
    report = json.loads((res / "verdict2" / "claims.json").read_text())
    by_id = {r["id"]: r for r in report["claims"]}
    assert report["plan"] == "verdict2" and report["baselines"] == "../recipe"
    assert list(by_id) == [c["id"] for c in tomllib.loads(CLAIMS.read_text())["claim"]]
    assert all(r["verdict"] in VERDICTS for r in by_id.values()), {k: r["verdict"] for k, r in by_id.items()}
    assert by_id["fox-below-rope-beyond"]["verdict"] == "confirmed"
    assert by_id["fox-below-rope-in"]["verdict"] == "confirmed"
    assert by_id["pope-below-rope-beyond"]["verdict"] == "contradicted"
    assert by_id["mta-below-rope-in"]["verdict"] == "confirmed"
    fox = by_id["fox-below-rope-beyond"]
    assert [f["length"] for f in fox["figures"]] == LENGTHS[1:]
    assert fox["runs"] == {"fox": ["fox-s0", "fox-s1"], "rope": ["rope-s0", "rope-s1"]}
    assert fox["planned"] == {"fox": ["fox-s0", "fox-s1", "fox-s2"], "rope": ["rope-s0", "rope-s1", "rope-s2"]}
    assert by_id["docmask-kerple-in"]["runs"]["kerple"] == ["kerple-warm10-s0", "kerple-warm10-s1"]  # reused
    assert fox["covers"] == "seeds and documents" and by_id["rnope-swa-below-rope-beyond"]["covers"] == "documents only"
    table = (res / "verdict2" / "claims.md").read_text()
    assert table.startswith("# Claims of the newer methods' papers against the verdict2 runs")
    assert "| **fox-below-rope-beyond**: FoX outperforms the Transformer" in table
    assert "ppl(fox) - ppl(rope) < 0 at every length >= 2T (T 512)" in table
    assert "## Not tested in the verdict2 runs" in table and "| **pope-vs-yarn**: " in table
    assert "wrote results/verdict2/claims.md (" in out.stdout and "confirmed" in out.stdout


MISSING = '''
[[claim]]
id = "sb"
paper = "p"
claim = "FoX below stick-breaking"
evidence = "e"
train_len = 512
metric = "ppl"
a = "fox"
b = "stickbreaking"
direction = "below"
lengths = [8192]
'''


def test_missing_runs_are_named_where_they_belong_and_the_report_summary_is_its_own(trees):
    cwd, res = trees
    (res / "verdict2" / "claims.toml").write_text(MISSING)
    begin = "<!-- claims summary: made by scripts/repro/claims_epoch.py from results/{}/claims.json -->"
    end = "<!-- end of the claims summary -->"
    report_md = res / "REPORT.md"
    report_md.write_text(f"# R\n{begin.format('epoch')}\nepoch table\n{end}\nmid\n{begin.format('verdict2')}\nold\n{end}\n")
    out = run_claims(cwd, "--results", "results/verdict2")
    assert out.returncode == 0, out.stderr
    r = json.loads((res / "verdict2" / "claims.json").read_text())["claims"][0]
    assert r["verdict"] == "not tested" and r["missing"] == [f"runs/T512/stickbreaking-s{s}" for s in (0, 1, 2)]
    assert "| waits for 3 runs at T 512 | **not tested** |" in (res / "verdict2" / "claims.md").read_text()
    text = report_md.read_text()
    assert "epoch table" in text and "old" not in text and "| **sb**: FoX below stick-breaking |" in text
    assert text.index("**sb**") > text.index("mid")


BAD = [
    ('a = "fox"\nb = "stickbreaking"', 'a = "fox"\nb = "alibi"',
     "claim 'sb': b = 'alibi' is not a method of the verdict2 plan at T 512"),
    ("train_len = 512", "train_len = 128", "claim 'sb': train_len must be one of the verdict2 plan's 512, 2048, got 128"),
    ("lengths = [8192]", "lengths = [256]", "claim 'sb': length 256 is not evaluated at T 512"),
    ('direction = "below"', 'direction = "lower"', "claim 'sb': direction must be below or above"),
]


@pytest.mark.parametrize("old, new, message", BAD, ids=[m.split(": ", 1)[1][:30] for _, _, m in BAD])
def test_a_malformed_claim_is_one_line_before_any_work(trees, old, new, message):
    cwd, res = trees
    (res / "verdict2" / "claims.toml").write_text(MISSING.replace(old, new))
    before = {p: p.read_bytes() for p in res.rglob("*") if p.is_file()}
    out = run_claims(cwd)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("error: results/verdict2/claims.toml: ") and message in lines[0], lines
    assert {p: p.read_bytes() for p in res.rglob("*") if p.is_file()} == before


def test_a_folder_holding_another_config_than_its_planned_run_is_refused(trees):
    """rnope-swa and rope-p0.5 are RoPE by model.method: a run folder is its planned run only with the
    planned layout, fraction and document masking."""
    cwd, res = trees
    folder = res / "verdict2" / "runs" / "T512" / "rnope-swa-s1"
    fabricate(folder, "rope", 1, 0.0)  # a plain RoPE run put where rnope-swa's seed 1 belongs
    out = run_claims(cwd)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "rnope-swa-s1 is not the planned rnope-swa-s1: its config has model.layers = ''" in lines[0]
    assert not (res / "verdict2" / "claims.json").exists()


def test_verdict2_options(trees):
    cwd, res = trees
    for args, message in [(("--baselines", "nowhere"), "--baselines nowhere is not a folder"),
                          (("--results", "results/none"), "--results results/none is not a folder")]:
        out = run_claims(cwd, *args)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and message in lines[0], lines
    out = script("claims_epoch.py", "--results", "results/verdict2", "--baselines", "results/recipe", cwd=cwd)
    assert out.returncode == 2 and out.stderr.strip() == "error: --baselines goes with --plan verdict2"
    help_out = script("claims_epoch.py", "--help", cwd=cwd)
    assert help_out.returncode == 0 and "verdict2" in help_out.stdout and "--baselines" in help_out.stdout


def test_a_missing_reused_run_is_named_in_the_recipe_tree(trees):
    cwd, res = trees
    (res / "verdict2" / "claims.toml").write_text(MISSING.replace('b = "stickbreaking"', 'b = "kerple"'))
    shutil.rmtree(res / REUSED_KERPLE)
    shutil.rmtree(res / REUSED_KERPLE_S1)
    out = run_claims(cwd)
    assert out.returncode == 0, out.stderr
    r = json.loads((res / "verdict2" / "claims.json").read_text())["claims"][0]
    assert r["missing"] == ["../recipe/runs/T512/kerple-warm10-s0", "../recipe/runs/T512/kerple-warm10-s1",
                            "runs/T512/kerple-s2"]


@pytest.mark.parametrize("where", ["verdict2/runs/T512/rope-s1", str(REUSED_KERPLE)])
def test_a_run_of_another_recipe_is_refused(trees, where):
    """An epoch-recipe run (1% warm-up) where a warm10 run belongs, in the verdict2 tree or the recipe
    run it reuses, is not that run."""
    cwd, res = trees
    folder = res / where
    shutil.rmtree(folder)
    method, seed = ("rope", 1) if "rope" in where else ("kerple", 0)
    fabricate(folder, method, seed, 0.0)  # the fabricated config keeps the epoch recipe's warm-up
    out = run_claims(cwd)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert f"is not the planned {method}-s{seed}: its config has train.warmup_frac = 0.01 (planned 0.1)" in lines[0]
    assert not (res / "verdict2" / "claims.json").exists()


def test_the_five_are_the_verdict2_plan_s_own_runs_and_the_reused_recipe_runs(monkeypatch):
    """The epoch recipe's five (results/epoch) are not read: each run of the five is the verdict2
    tree's, but those plan.py VERDICT_REUSED maps to the recipe tree (--baselines), at 512 and 2048."""
    monkeypatch.syspath_prepend(str(REPRO))
    import claims_plans

    plans = claims_plans.verdict2_plan(Path("results/verdict2"), Path("results/recipe"))
    at512, at2048 = plans[512], plans[2048]
    assert set(plans) == {512, 2048} and set(at2048["runs"]) == set(FIVE)
    assert at512["runs"]["kerple"] == ["kerple-s0", "kerple-s1", "kerple-s2"]
    assert at512["shown"]["kerple", "kerple-s0"] == "../recipe/runs/T512/kerple-warm10-s0"
    assert at512["shown"]["kerple", "kerple-s1"] == "../recipe/runs/T512/kerple-warm10-s1"
    assert at512["shown"]["rope", "rope-s0"] == "runs/T512/rope-s0"
    assert [at2048["shown"]["rope", f"rope-s{s}"] for s in (0, 1, 2)] == [
        "../recipe/runs/T2048/rope-warm10-s0", "../recipe/runs/T2048/rope-warm10-s1", "runs/T2048/rope-s2"]
    assert at2048["shown"]["kerple", "kerple-s0"] == "runs/T2048/kerple-s0"  # ran without the suite: run again
    assert at2048["shown"]["kerple", "kerple-s1"] == "../recipe/runs/T2048/kerple-warm10-s1"
    shown = [v for entry in plans.values() for v in entry["shown"].values()]
    assert not [v for v in shown if "epoch" in v]
    assert all(e["train.warmup_frac"] == 0.1 for entry in plans.values() for e in entry["expected"].values())
