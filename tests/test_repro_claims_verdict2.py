"""scripts/repro/claims_epoch.py --plan verdict2: results/verdict2/claims.toml names only methods and
lengths of plan.py's verdict2 plan at T 512 and the epoch plan's five there; on fabricated finished runs
(results/verdict2/runs/T512 and results/epoch/runs/T512 under a temporary folder, as a user's tree)
every claim gets a verdict and claims.md / claims.json are written; a malformed claim, a folder holding
another run's config or a bad option is a one-line error before anything is written."""

import json
from pathlib import Path
import re
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
    """The verdict2 plan's methods (run names without the seed) -> the --set overrides of seed 0."""
    return {Path(job["run"]).name[:-3]: train_sets(job["cmd"])[0] for job in plan("verdict2")
            if job["run"].endswith("-s0")}


def test_every_verdict2_claim_names_planned_methods_and_lengths():
    data = tomllib.loads(CLAIMS.read_text())
    methods = set(verdict2_methods())
    assert methods == {"fox", "ssmax-rope", "pope", "rnope-swa", "rope-p0.5", "dapev2-fox", "kerple-docmasked", "mta",
                       "dapev2-kerple-docmasked"}
    at_512 = {train_sets(j["cmd"])[0][0].split("=")[1] for j in plan("epoch") if "train.seq_len=512" in j["cmd"]}
    assert at_512 == set(FIVE)
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


def fabricate(folder: Path, method: str, seed: int, shift: float, sets: tuple = (), inside: float = 0.0) -> Path:
    """fake_run at T 512 with the planned settings (`sets`: key=value of model.layers, model.rope_fraction,
    train.documents) and its in-distribution NLLs shifted by `inside`."""
    fake_run(folder, method, seed, shift, seq_len=512)
    cfg = load_config(str(folder / "config.toml"))
    for setting in sets:
        key, value = setting.split("=")
        section, name = key.split(".")
        setattr(getattr(cfg, section), name, float(value) if name == "rope_fraction" else value)
    (folder / "config.toml").write_text(to_toml(cfg))
    result = json.loads((folder / "eval.json").read_text())
    result["in_distribution"]["window_nll"] = [v + inside for v in result["in_distribution"]["window_nll"]]
    (folder / "eval.json").write_text(json.dumps(result))
    return folder


SHIFTS = {"fox": (-0.3, -0.3), "pope": (0.3, 0.3), "mta": (0.0, -0.3), "rnope-swa": (0.0, 0.0)}


@pytest.fixture
def trees(tmp_path):
    """results/verdict2 with two seeds of every verdict2 method (FoX 0.3 nats below RoPE everywhere,
    PoPE 0.3 above, MTA 0.3 below in distribution only, one seed of rnope-swa) and results/epoch with
    the five at T 512 but stick-breaking."""
    res = tmp_path / "results"
    sets = verdict2_methods()
    for name, overrides in sets.items():
        method = next(s.split("=")[1] for s in overrides if s.startswith("model.method="))
        extra = tuple(s for s in overrides if s.split("=")[0] in ("model.layers", "model.rope_fraction",
                                                                   "train.documents"))
        shift, inside = SHIFTS.get(name, (0.01, 0.01))
        for seed in (0,) if name == "rnope-swa" else (0, 1):
            fabricate(res / "verdict2" / "runs" / "T512" / f"{name}-s{seed}", method, seed, shift + 0.002 * seed, extra,
                      inside)
    for method in FIVE[:4]:
        for seed in (0, 1):
            fabricate(res / "epoch" / "runs" / "T512" / f"{method}-s{seed}", method, seed, 0.002 * seed)
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
    assert report["plan"] == "verdict2" and report["baselines"] == "../epoch"
    assert list(by_id) == [c["id"] for c in tomllib.loads(CLAIMS.read_text())["claim"]]
    assert all(r["verdict"] in VERDICTS for r in by_id.values()), {k: r["verdict"] for k, r in by_id.items()}
    assert by_id["fox-below-rope-beyond"]["verdict"] == "confirmed"
    assert by_id["fox-below-rope-in"]["verdict"] == "confirmed"
    assert by_id["pope-below-rope-beyond"]["verdict"] == "contradicted"
    assert by_id["mta-below-rope-in"]["verdict"] == "confirmed"
    fox = by_id["fox-below-rope-beyond"]
    assert [f["length"] for f in fox["figures"]] == LENGTHS[1:]
    assert fox["runs"] == {"fox": ["fox-s0", "fox-s1"], "rope": ["rope-s0", "rope-s1"]}
    assert fox["planned"] == {"fox": ["fox-s0", "fox-s1", "fox-s2"], "rope": ["rope-s0", "rope-s1"]}
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
    assert r["verdict"] == "not tested" and r["missing"] == ["../epoch/runs/T512/stickbreaking-s0",
                                                           "../epoch/runs/T512/stickbreaking-s1"]
    assert "| waits for 2 runs at T 512 | **not tested** |" in (res / "verdict2" / "claims.md").read_text()
    text = report_md.read_text()
    assert "epoch table" in text and "old" not in text and "| **sb**: FoX below stick-breaking |" in text
    assert text.index("**sb**") > text.index("mid")


BAD = [
    ('a = "fox"\nb = "stickbreaking"', 'a = "fox"\nb = "alibi"',
     "claim 'sb': b = 'alibi' is not a method of the verdict2 plan at T 512"),
    ("train_len = 512", "train_len = 128", "claim 'sb': train_len must be one of the verdict2 plan's 512, got 128"),
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
    out = script("claims_epoch.py", "--results", "results/epoch", "--baselines", "results/epoch", cwd=cwd)
    assert out.returncode == 2 and out.stderr.strip() == "error: --baselines goes with --plan verdict2"
    help_out = script("claims_epoch.py", "--help", cwd=cwd)
    assert help_out.returncode == 0 and "verdict2" in help_out.stdout and "--baselines" in help_out.stdout


def test_a_method_the_verdict2_plan_runs_itself_is_its_own(monkeypatch):
    """If the verdict2 plan reruns one of the five (a recipe that changes at T 512), its runs are read
    from the verdict2 tree, not from the epoch one."""
    monkeypatch.syspath_prepend(str(REPRO))
    import claims_plans
    import plan as plans

    entry = claims_plans.verdict2_plan(Path("results/verdict2"), Path("results/epoch"))[512]
    assert entry["shown"]["rope"] == "../epoch/runs/T512" and entry["runs"]["rope"] == ["rope-s0", "rope-s1"]
    monkeypatch.setitem(plans.VERDICT_RUNS, "rope", ("rope", ()))
    entry = claims_plans.verdict2_plan(Path("results/verdict2"), Path("results/epoch"))[512]
    assert entry["shown"]["rope"] == "runs/T512" and entry["runs"]["rope"] == ["rope-s0", "rope-s1", "rope-s2"]
    assert entry["shown"]["kerple"] == "../epoch/runs/T512"
