"""scripts/repro for issue 29's single-epoch 125M runs: the epoch plan holds the runs the issue lists
(plan.py), run_jobs.py runs "solo" jobs one per GPU at once, and collect_epoch.py turns device trees
and the committed results/epoch into results/epoch with `lenx compare`'s tables, as a user runs them
(subprocesses, relative paths, another working directory)."""

import copy
import json
import os
from pathlib import Path
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest

from lenx.config import load_config, to_toml
from lenx.report.compare import compare_runs

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "scripts" / "repro"
RESULTS = ROOT / "results" / "epoch"
TOKENS = 100_000_000


def script(name: str, *args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **(env or {}))
    return subprocess.run([sys.executable, str(REPRO / name), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


ALL_GPUS = {"CUDA_VISIBLE_DEVICES": ""}  # run_jobs.py numbering the device's GPUs, whatever this process sees


def epoch_plan(smoke: bool = False) -> list[dict]:
    out = script("plan.py", "epoch", env={"REPRO_SMOKE": "1" if smoke else "0"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def train_sets(cmd: str) -> tuple[list[str], str]:
    """The --set overrides and --out of a job's `lenx train` command."""
    train = shlex.split(cmd.split(" && ")[0])
    assert train[:5] == ["python3", "-m", "lenx", "train", "-c"] and train[5] == "125m", cmd
    sets = [train[i + 1] for i, a in enumerate(train) if a == "--set"]
    return sets, train[train.index("--out") + 1]


def test_the_epoch_plan_holds_the_runs_issue_29_lists():
    jobs = epoch_plan()
    assert len({j["id"] for j in jobs}) == len(jobs) == len({j["run"] for j in jobs}) == 37
    runs = {}
    for job in jobs:
        sets, out = train_sets(job["cmd"])
        cfg = load_config("125m", sets)
        t = cfg.train
        assert job["kind"] == "solo" and out == job["run"]
        assert (t.sampling, cfg.data.corpus, cfg.eval.max_length, t.grad_accum) == ("pass", "code", 16384, 1)
        assert t.steps == 3052 and t.batch_size * t.seq_len == 32768 and t.steps * t.batch_size * t.seq_len >= TOKENS
        assert (cfg.model.n_layer, cfg.model.d_model) == (12, 768)
        assert job["cmd"].endswith(f" && python3 -m lenx eval {out} --no-progress && rm -rf {out}/ckpt")
        T, name = f"T{t.seq_len}", Path(out).name
        assert out == f"runs/epoch/{T}/{name}"
        assert job["id"] == (f"epoch/{name}" if T == "T128" else f"epoch/{T}/{name}")
        runs[(T, cfg.model.method, cfg.model.dape_hidden, t.seed)] = t.batch_size
    T128 = {("T128", m, 32, s) for m in ("kerple", "dape-kerple", "dapev2-kerple", "rope", "stickbreaking")
            for s in (0, 1, 2)}
    T128 |= {("T128", m, 32, 0) for m in ("alibi", "fire", "nope")}
    T128 |= {("T128", "dape-kerple", 64, s) for s in (0, 1)} | {("T128", "dapev2-kerple", D, s) for D in (10, 21)
                                                                for s in (0, 1)}
    T512 = {("T512", m, 32, s) for m in ("kerple", "dape-kerple", "dapev2-kerple", "rope", "stickbreaking")
            for s in (0, 1)}
    T2048 = {("T2048", m, 32, 0) for m in ("stickbreaking", "rope", "kerple")}
    assert set(runs) == T128 | T512 | T2048
    assert {runs[k] for k in T128} == {256} and {runs[k] for k in T512} == {64} and {runs[k] for k in T2048} == {16}
    lengths = [Path(j["run"]).parts[2] for j in jobs]
    assert lengths == sorted(lengths, key=["T128", "T512", "T2048"].index)  # T 128 first, then 512, then 2048


def test_the_jobs_that_ran_keep_their_ids_and_commands():
    """The T 128 jobs are those of the plan that ran on the device, so done.txt still names them."""
    ran = json.loads((RESULTS / "device" / "session16" / "plan.json").read_text())
    now = {j["id"]: j for j in epoch_plan()}
    assert all(now[j["id"]]["cmd"] == j["cmd"] and now[j["id"]]["run"] == j["run"] for j in ran)
    assert set((RESULTS / "done.txt").read_text().split()) <= set(now)


def test_the_smoke_plan_is_the_same_jobs_at_toy_sizes_on_the_cpu():
    full, smoke = epoch_plan(), epoch_plan(smoke=True)
    assert [j["id"] for j in smoke] == [j["id"] for j in full]
    for job in smoke:
        cfg = load_config("125m", train_sets(job["cmd"])[0])
        assert (cfg.train.device, cfg.train.steps, cfg.train.batch_size, cfg.model.n_layer) == ("cpu", 4, 2, 2)
        assert cfg.eval.windows == 2 and cfg.eval.max_length >= 2 * cfg.train.seq_len


def test_solo_jobs_run_one_per_gpu_at_once(tmp_path):
    """Four solo jobs on two (fake) GPUs: two at a time, never two on one GPU; a skipped job never runs."""
    work = tmp_path / "work"
    work.mkdir()
    jobs = [{"id": f"j{i}", "kind": "solo", "run": f"runs/j{i}",
             "cmd": f"date +%s.%N > runs/j{i}/start && sleep 1.5 && echo $CUDA_VISIBLE_DEVICES > runs/j{i}/gpu"
                    f" && date +%s.%N > runs/j{i}/end"} for i in range(5)]
    (work / "plan.json").write_text(json.dumps(jobs))
    (work / "done.txt").write_text("j2\nold-id\n")
    out = script("run_jobs.py", "plan.json", "--gpus", "2", "--status", "runs/status.json", "--skip", "done.txt",
                 cwd=work, env=ALL_GPUS)
    assert out.returncode == 0, out.stderr
    assert "--skip ids not in the plan, ignored: old-id" in out.stdout
    status = {j["id"]: j for j in json.loads((work / "runs" / "status.json").read_text())["jobs"]}
    assert status["j2"]["state"] == "skipped" and not (work / "runs" / "j2").exists()
    ran = [i for i in range(5) if i != 2]
    assert all(status[f"j{i}"]["state"] == "done" for i in ran)
    spans = {i: (float((work / f"runs/j{i}/start").read_text()), float((work / f"runs/j{i}/end").read_text()),
                 int((work / f"runs/j{i}/gpu").read_text())) for i in ran}
    assert all(spans[i][2] == status[f"j{i}"]["gpu"] for i in ran) and {s[2] for s in spans.values()} == {0, 1}
    overlapping = [(a, b) for a in ran for b in ran if a < b and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]]
    assert overlapping and all(spans[a][2] != spans[b][2] for a, b in overlapping)


def test_first_gpu_moves_the_jobs(tmp_path):
    """--first-gpu 1 --gpus 1 (the other GPU of a two-GPU call kept for other work): jobs see GPU 1."""
    work = tmp_path / "work"
    work.mkdir()
    jobs = [{"id": f"j{i}", "kind": "solo", "run": f"runs/j{i}", "cmd": f"echo $CUDA_VISIBLE_DEVICES > runs/j{i}/gpu"}
            for i in range(2)]
    (work / "plan.json").write_text(json.dumps(jobs))
    out = script("run_jobs.py", "plan.json", "--gpus", "1", "--first-gpu", "1", "--status", "status.json", cwd=work,
                 env=ALL_GPUS)
    assert out.returncode == 0, out.stderr
    assert [(work / f"runs/j{i}/gpu").read_text().strip() for i in range(2)] == ["1", "1"]
    bad = script("run_jobs.py", "plan.json", "--gpus", "1", "--first-gpu", "-1", "--status", "s2.json", cwd=work,
                 env=ALL_GPUS)
    assert bad.returncode == 2 and bad.stderr == "error: --gpus must be >= 1 and --first-gpu >= 0 (got 1, -1)\n", bad.stderr
    assert not (work / "s2.json").exists()


def test_an_inherited_cuda_visible_devices_is_kept(tmp_path):
    """Started with CUDA_VISIBLE_DEVICES=1 (one GPU of a two-GPU call, scripts/device/two_gpus.sh), the
    jobs see GPU 1, not the device's GPU 0; --first-gpu and --gpus index the visible GPUs, and asking
    for more than are visible is one error line."""
    work = tmp_path / "work"
    work.mkdir()
    jobs = [{"id": f"j{i}", "kind": "solo", "run": f"runs/j{i}", "cmd": f"echo $CUDA_VISIBLE_DEVICES > runs/j{i}/gpu"}
            for i in range(2)]
    (work / "plan.json").write_text(json.dumps(jobs))
    out = script("run_jobs.py", "plan.json", "--gpus", "1", "--status", "status.json", cwd=work,
                 env={"CUDA_VISIBLE_DEVICES": "1"})
    assert out.returncode == 0, out.stderr
    assert [(work / f"runs/j{i}/gpu").read_text().strip() for i in range(2)] == ["1", "1"]
    out = script("run_jobs.py", "plan.json", "--gpus", "1", "--first-gpu", "1", "--status", "s3.json", cwd=work,
                 env={"CUDA_VISIBLE_DEVICES": "2,5"})
    assert out.returncode == 0, out.stderr
    assert [(work / f"runs/j{i}/gpu").read_text().strip() for i in range(2)] == ["5", "5"]
    bad = script("run_jobs.py", "plan.json", "--gpus", "2", "--status", "s4.json", cwd=work,
                 env={"CUDA_VISIBLE_DEVICES": "1"})
    assert bad.returncode == 2 and bad.stderr.startswith("error: --first-gpu 0 --gpus 2 asks for more GPUs")
    assert len(bad.stderr.splitlines()) == 1 and not (work / "s4.json").exists()


def test_a_solo_job_shares_its_gpu_with_nothing(tmp_path):
    """One GPU with two lm slots: the two lm jobs run together, the solo job alone."""
    work = tmp_path / "work"
    work.mkdir()
    jobs = [{"id": f"{kind}{i}", "kind": kind, "run": f"runs/{i}",
             "cmd": f"date +%s.%N > runs/{i}/start && sleep 1 && date +%s.%N > runs/{i}/end"}
            for i, kind in enumerate(("lm", "solo", "lm"))]
    (work / "plan.json").write_text(json.dumps(jobs))
    out = script("run_jobs.py", "plan.json", "--gpus", "1", "--lm-slots", "2", "--status", "status.json", cwd=work)
    assert out.returncode == 0, out.stderr
    t = [(float((work / f"runs/{i}/start").read_text()), float((work / f"runs/{i}/end").read_text())) for i in range(3)]
    assert t[0][0] < t[2][1] and t[2][0] < t[0][1]  # the lm jobs share the GPU
    assert all(t[i][1] <= t[1][0] or t[1][1] <= t[i][0] for i in (0, 2))  # the solo job shares it with neither
    jobs[1]["kind"] = "whole"
    (work / "plan.json").write_text(json.dumps(jobs))
    out = script("run_jobs.py", "plan.json", "--gpus", "1", "--status", "status.json", cwd=work)
    assert out.returncode != 0 and "unknown job kind whole" in out.stderr


# --- the collector -----------------------------------------------------------------------------------

KERPLE = RESULTS / "runs" / "T128" / "kerple-s0"


def fake_run(folder: Path, method: str, seed: int, shift: float, seq_len: int = 128, hidden: int = 32,
             steps_done: int | None = None, evaluated: bool = True) -> Path:
    """A run folder shaped like the committed kerple-s0: its config, meta and metrics, and an eval.json
    with window NLLs shifted by `shift` plus noise (at T 512 from 512 on, as lenx eval writes it)."""
    folder.mkdir(parents=True)
    cfg = load_config(str(KERPLE / "config.toml"))
    cfg.model.method, cfg.model.dape_hidden, cfg.train.seed = method, hidden, seed
    cfg.train.seq_len, cfg.train.batch_size = seq_len, 32768 // seq_len
    (folder / "config.toml").write_text(to_toml(cfg))
    shutil.copy(KERPLE / "meta.json", folder / "meta.json")
    metrics = (KERPLE / "metrics.jsonl").read_text().splitlines()
    if steps_done is not None:
        metrics = [line for line in metrics if json.loads(line)["step"] <= steps_done]
    (folder / "metrics.jsonl").write_text("\n".join(metrics) + "\n")
    (folder / "command.txt").write_text(f"train {method} {seed}\n")
    (folder / "job.log").write_text("log\n")
    if not evaluated:
        return folder
    result = copy.deepcopy(json.loads((KERPLE / "eval.json").read_text()))
    rng = np.random.default_rng([seed, seq_len, hidden, int(abs(shift) * 1000)])
    result.update(method=method, train_len=seq_len, run=str(folder))
    result["results"] = {L: r for L, r in result["results"].items() if int(L) >= max(256, seq_len)}
    result["lengths"] = [int(L) for L in result["results"]]
    for L, r in result["results"].items():
        noise = 0.05 * rng.standard_normal(len(r["window_nll"]))
        r["window_nll"] = [v + shift + n for v, n in zip(r["window_nll"], noise)]
        r["delta_p_window_nll"] = [v + shift for v in r["delta_p_window_nll"]]
        if int(L) <= seq_len:
            del r["delta_p_window_nll"]
    (folder / "eval.json").write_text(json.dumps(result))
    return folder


@pytest.fixture
def trees(tmp_path):
    """here/results/epoch: the committed one cut back to its first run (its README, claims.toml, the run
    kerple-s0 and the device files of the machine that ran it; the later runs left out, so the test
    does not change as runs land); here/back/runs/epoch: a device tree of a later session with finished runs
    at T 128 and T 512, one cut off and one not evaluated."""
    here = tmp_path / "here"
    base = here / "results" / "epoch"
    for part in ("runs/T128/kerple-s0", "device/session16"):
        shutil.copytree(RESULTS / part, base / part)
    for name in ("README.md", "claims.toml"):
        shutil.copy(RESULTS / name, base / name)
    (base / "done.txt").write_text("epoch/kerple-s0\n")
    device = here / "back" / "runs" / "epoch"
    made = {("T128", "dapev2-kerple-s0"): fake_run(device / "T128" / "dapev2-kerple-s0", "dapev2-kerple", 0, -0.1),
            ("T128", "kerple-s1"): fake_run(device / "T128" / "kerple-s1", "kerple", 1, 0.02),
            ("T128", "dape-kerple-D64-s0"): fake_run(device / "T128" / "dape-kerple-D64-s0", "dape-kerple", 0, -0.05,
                                                     hidden=64),
            ("T128", "dapev2-kerple-D10-s0"): fake_run(device / "T128" / "dapev2-kerple-D10-s0", "dapev2-kerple", 0,
                                                       -0.08, hidden=10),
            ("T512", "kerple-s0"): fake_run(device / "T512" / "kerple-s0", "kerple", 0, -0.2, seq_len=512),
            ("T512", "dapev2-kerple-s0"): fake_run(device / "T512" / "dapev2-kerple-s0", "dapev2-kerple", 0, -0.4,
                                                   seq_len=512),
            ("T512", "dape-kerple-s0"): fake_run(device / "T512" / "dape-kerple-s0", "dape-kerple", 0, -0.3,
                                                 seq_len=512),
            ("T512", "rope-s0"): fake_run(device / "T512" / "rope-s0", "rope", 0, 0.5, seq_len=512),
            ("T512", "kerple-s1"): fake_run(device / "T512" / "kerple-s1", "kerple", 1, -0.22, seq_len=512),
            ("T2048", "kerple-s0"): fake_run(device / "T2048" / "kerple-s0", "kerple", 0, 0.1, seq_len=2048)}
    fake_run(device / "T128" / "rope-s0", "rope", 0, 0.3, steps_done=1500)  # cut off: the machine went back
    fake_run(device / "T128" / "stickbreaking-s0", "stickbreaking", 0, 0.1, evaluated=False)
    status = {"updated": 2e9, "jobs": [{"state": "done", "id": f"epoch/{name}", "run": f"runs/epoch/{T}/{name}",
                                        "gpu": i % 4, "seconds": 100.0 + i} for i, (T, name) in enumerate(made)]}
    status["jobs"].append({"state": "running", "id": "epoch/rope-s0", "run": "runs/epoch/T128/rope-s0", "gpu": 1})
    (device / "status.json").write_text(json.dumps(status))
    (device / "plan.json").write_text("[]")
    return here, device, made


def test_collect_epoch_merges_device_trees_into_results(trees):
    here, device, made = trees
    out = script("collect_epoch.py", "results/epoch", "back/runs/epoch", "--session", "s17", "--resamples", "200",
                 cwd=here)
    assert out.returncode == 0, out.stderr
    res = here / "results" / "epoch"
    assert (res / "done.txt").read_text().split() == [
        "epoch/kerple-s0", "epoch/dapev2-kerple-s0", "epoch/kerple-s1", "epoch/dape-kerple-D64-s0",
        "epoch/dapev2-kerple-D10-s0", "epoch/T512/kerple-s0", "epoch/T512/dapev2-kerple-s0",
        "epoch/T512/dape-kerple-s0", "epoch/T512/rope-s0", "epoch/T512/kerple-s1", "epoch/T2048/kerple-s0"]
    assert sorted(p.name for p in (res / "runs" / "T128").iterdir()) == [
        "dape-kerple-D64-s0", "dapev2-kerple-D10-s0", "dapev2-kerple-s0", "kerple-s0", "kerple-s1"]
    assert (res / "device" / "s17" / "status.json").is_file() and (res / "device" / "session16" / "status.json").is_file()
    assert (res / "README.md").read_text() == (RESULTS / "README.md").read_text()

    # Kerple at T 128 (2 seeds, shifted 0 and +0.02) and at T 512 (2 seeds, -0.2 and -0.22) minus Kerple at
    # T 2048 (1 seed, +0.1), paired window by window at each length both evaluated; one seed on the T 2048
    # side, so documents only
    across = json.loads((res / "across.json").read_text())["rows"]
    assert [(r["trained_at"], r["length"]) for r in across] == [(T, L) for T in (128, 512) for L in (2048, 4096, 8192,
                                                                                                   16384)]
    assert all(r["method"] == "kerple" and r["against"] == 2048 and r["seeds"] == [2, 1] for r in across)
    assert all(r["lo"] <= r["diff"] < 0 and r["covers"] == "documents only" for r in across)
    assert "| kerple | 512 (2 seeds) |" in (res / "across.md").read_text()

    results = json.loads((res / "T128" / "results.json").read_text())
    by_name = {r["name"]: r for r in results["runs"]}
    assert list(by_name) == ["kerple-s0", "dapev2-kerple-s0", "kerple-s1", "dape-kerple-D64-s0", "dapev2-kerple-D10-s0"]
    assert by_name["kerple-s0"]["device_time"] == {"seconds": 299.1, "gpu": 0, "session": "session16"}
    assert by_name["kerple-s1"]["device_time"] == {"seconds": 101.0, "gpu": 1, "session": "s17"}
    assert by_name["dape-kerple-D64-s0"]["label"] == "dape-kerple (D=64)" and by_name["kerple-s1"]["seed"] == 1
    assert by_name["kerple-s0"]["command"].startswith("python3 -m lenx train -c 125m")
    assert all(r["corpus"] == "code" and r["epochs"] == 0.299931 and r["environment"]["gpu"] for r in by_name.values())
    assert by_name["kerple-s0"]["results"]["16384"]["ppl"] == json.loads((KERPLE / "eval.json").read_text())[
        "results"]["16384"]["ppl"]
    assert set(results["curves"]) == {"kerple s0", "dapev2-kerple s0", "kerple s1", "dape-kerple (D=64) s0",
                                      "dapev2-kerple (D=10) s0"}

    # the tables are lenx compare's over the collected run folders, with the labels that tell widths apart
    compared = json.loads((res / "T128" / "compare.json").read_text())
    folders = [res / "runs" / "T128" / name for name in by_name]
    direct = compare_runs(folders, reference="kerple", n=200, labels=[r["label"] for r in by_name.values()])
    assert compared["all"]["methods"]["kerple"]["runs"] == ["runs/T128/kerple-s0", "runs/T128/kerple-s1"]
    for method, m in direct["methods"].items():
        assert compared["all"]["methods"][method]["lengths"] == m["lengths"]
    assert compared["all"]["differences"] == direct["differences"]
    assert compared["all"]["differences"]["dapev2-kerple"]["16384"]["diff"] < 0  # shifted down by 0.1
    assert compared["capacity"]["reference"] == "dape-kerple (D=64)"
    assert set(compared["capacity"]["methods"]) == {"dapev2-kerple", "dape-kerple (D=64)", "dapev2-kerple (D=10)"}
    tables = (res / "T128" / "tables.md").read_text()
    assert "| kerple (2 seeds) |" in tables and "## Capacity" in tables and "| kerple-s0 | 0 | NVIDIA H100" in tables
    assert "one pass over 100.0M tokens of `code` (3052 steps of 256 x 128)" in tables

    assert "dape" not in compared  # T 128 here has no DAPE with D 32
    t512 = json.loads((res / "T512" / "compare.json").read_text())
    assert t512["all"]["lengths"][0] == 512 and t512["all"]["methods"]["kerple"]["seeds"] == [0, 1]
    assert "capacity" not in t512 and t512["dape"]["reference"] == "dape-kerple"
    assert set(t512["dape"]["methods"]) == {"dapev2-kerple", "dape-kerple"}
    assert t512["dape"]["differences"]["dapev2-kerple"]["16384"]["diff"] < 0  # shifted down by 0.1 more
    tables = (res / "T512" / "tables.md").read_text()
    assert "(3052 steps of 64 x 512)" in tables and "## DAPE V2 against DAPE" in tables

    # collected again (the committed tree alone): the same files
    before = {p: p.read_bytes() for p in res.rglob("*") if p.is_file()}
    again = script("collect_epoch.py", "results/epoch", "--resamples", "200", cwd=here)
    assert again.returncode == 0, again.stderr
    assert {p: p.read_bytes() for p in res.rglob("*") if p.is_file()} == before


def test_a_later_unfinished_copy_does_not_replace_a_finished_run(trees, tmp_path):
    here, device, made = trees
    assert script("collect_epoch.py", "results/epoch", "back/runs/epoch", "--session", "s17", "--resamples", "200",
                  cwd=here).returncode == 0
    later = here / "later" / "runs" / "epoch"
    fake_run(later / "T128" / "kerple-s1", "kerple", 1, 0.9, steps_done=1000)  # a re-run cut off
    out = script("collect_epoch.py", "results/epoch", "later/runs/epoch", "--session", "s18", "--resamples", "200",
                 cwd=here)
    assert out.returncode == 0, out.stderr
    kept = here / "results" / "epoch" / "runs" / "T128" / "kerple-s1" / "metrics.jsonl"
    assert kept.read_text() == (made[("T128", "kerple-s1")] / "metrics.jsonl").read_text()


def test_collect_epoch_refuses_bad_input_before_writing(trees):
    here, device, made = trees
    res = here / "results" / "epoch"
    before = {p: p.read_bytes() for p in res.rglob("*") if p.is_file()}
    for args, message in [(("results/epoch", "back/runs/epoch"), "1 device trees (back/runs/epoch) need as many "
                                                                  "--session names, got 0"),
                          (("results/epoch", "back/runs/epoch", "--session", "../x"), "a plain folder name"),
                          (("results/epoch", "nowhere"), "not a folder: nowhere"),
                          (("back",), "neither a device tree"), (("back",), "did you mean back/runs/epoch?"),
                          (("results/epoch", "--resamples", "5"), "--resamples must be at least 100")]:
        out = script("collect_epoch.py", *args, cwd=here)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert {p: p.read_bytes() for p in res.rglob("*") if p.is_file()} == before
    help_out = script("collect_epoch.py", "--help", cwd=here)
    assert help_out.returncode == 0 and "--session" in help_out.stdout


def test_collect_epoch_refuses_lengths_scored_on_other_windows(trees):
    """A T 2048 run evaluated with another eval seed cannot be set against the same method at T 128 or 512."""
    here, device, made = trees
    evaluation = made[("T2048", "kerple-s0")] / "eval.json"
    result = json.loads(evaluation.read_text())
    evaluation.write_text(json.dumps(result | {"eval_seed": result["eval_seed"] + 1}))
    out = script("collect_epoch.py", "results/epoch", "back/runs/epoch", "--session", "s17", "--resamples", "200",
                 cwd=here)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "was evaluated on other windows than" in lines[0], lines


@pytest.mark.slow
def test_the_committed_tables_are_what_the_collector_makes_of_the_committed_runs(tmp_path):
    """Every file under results/epoch (tables.md, compare.json, results.json, across.*, claims.*) and
    REPORT.md's claims summary are what collect_epoch.py makes again of the committed runs: numbers to
    within rounding noise (tests/_compare.py: another numpy or CPU moves the last digits), the rest
    exactly. About a minute or two: it recomputes every bootstrap."""
    from _compare import same_json, same_text

    here = tmp_path / "results" / "epoch"
    shutil.copytree(RESULTS, here)
    shutil.copy(RESULTS.parent / "REPORT.md", here.parent / "REPORT.md")
    out = script("collect_epoch.py", "results/epoch", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    made = sorted(p.relative_to(here) for p in here.rglob("*") if p.is_file())
    assert made == sorted(p.relative_to(RESULTS) for p in RESULTS.rglob("*") if p.is_file())
    for name in made:
        a, b = here / name, RESULTS / name
        if name.suffix == ".json":
            assert same_json(json.loads(a.read_text()), json.loads(b.read_text())) == [], name
        elif name.suffix in (".md", ".txt", ".toml", ".jsonl", ".log"):
            assert same_text(a.read_text(), b.read_text()) == [], name
        else:
            assert a.read_bytes() == b.read_bytes(), name
    assert same_text((here.parent / "REPORT.md").read_text(), (RESULTS.parent / "REPORT.md").read_text()) == []
