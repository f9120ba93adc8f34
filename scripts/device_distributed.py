"""Multi-GPU checks for lenx; scripts/device_distributed.sh runs this on a 2-GPU machine.

1. Equivalence: one GPU, 2-GPU DDP and 2-GPU FSDP2 train the `small` preset on the synthetic corpus
   with the same global batch (bf16 autocast); the three loss curves and their largest differences
   go to equivalence.json. If time allows, the same in fp32 (which separates bf16 rounding from bugs).
2. Throughput: tokens/s of the `small` and `125m` presets on 1 and 2 GPUs, read from metrics.jsonl
   after the first logging interval (warm-up), to throughput.json. Scaling efficiency is
   tps(2) / (2 tps(1)): "weak" keeps the per-GPU batch (global batch doubled on 2 GPUs), "strong"
   keeps the preset's global batch (each GPU does half).

--device cpu runs the same logic with tiny models on CPU processes (gloo), to test this script.
Every run's output is kept in <work>/logs; the tails of failed runs go to logs.txt in --out.
"""

import argparse
import json
import os
from pathlib import Path
import shutil
import signal
import statistics
import subprocess
import sys
import time

# Stand-ins for the presets in --device cpu mode: the same code paths at toy size.
CPU_MODELS = {
    "small": ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "train.seq_len=32", "train.batch_size=8"],
    "125m": ["model.n_layer=2", "model.d_model=64", "model.n_head=4", "train.seq_len=32", "train.batch_size=8"],
}


class Runner:
    def __init__(self, work: Path, device: str, budget_s: float):
        self.work, self.device, self.budget_s = work, device, budget_s
        self.t0 = time.time()
        self.failures: list[str] = []
        (work / "logs").mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ)
        # NVLink multicast stays off on shared multi-GPU hosts, also in every child process.
        self.env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
        # The same CPU threads for every run (torchrun would give each rank 1): on CPU one core per
        # process, on a GPU machine half the cores per process.
        cores = os.cpu_count() or 2
        self.env["OMP_NUM_THREADS"] = "1" if device == "cpu" else str(max(1, cores // 2))

    def over_budget(self) -> bool:
        return time.time() - self.t0 > self.budget_s

    def preset(self, name: str) -> tuple[str, list[str]]:
        """(config, overrides) for a preset on this device, on the synthetic corpus."""
        common = ["data.corpus=synthetic", f"data.root={str(self.work / 'data')!r}", f"train.device={self.device}"]
        if self.device == "cpu":
            return "tiny", common + CPU_MODELS[name]
        return name, common

    def train(self, name: str, nproc: int, config: str, overrides: list[str], timeout: int = 150) -> dict:
        """One `lenx train` (under torchrun when nproc > 1); returns its metrics records."""
        run_dir = self.work / "runs" / name
        shutil.rmtree(run_dir, ignore_errors=True)
        if nproc == 1:
            launch = [sys.executable, "-m", "lenx"]
        else:
            launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                      "-m", "lenx"]
        cmd = launch + ["train", "-c", config, "--no-progress", "-o", str(run_dir)]
        cmd += [a for o in overrides for a in ("--set", o)]
        env = dict(self.env)
        if self.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(nproc))  # 1 GPU runs use GPU 0 alone
        log = self.work / "logs" / f"{name}.log"
        t0 = time.time()
        print(f"[{time.time() - self.t0:5.0f} s] {name}: {nproc} process(es)", flush=True)
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            # Its own process group, so that a run past its time is stopped with all its ranks.
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = "timeout"
        result = {"name": name, "processes": nproc, "returncode": rc, "wall_s": round(time.time() - t0, 1)}
        metrics = run_dir / "metrics.jsonl"
        result["records"] = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
        meta = run_dir / "meta.json"
        if meta.exists():
            m = json.loads(meta.read_text())
            result.update(params=m["params"], backends=sorted(set(m["backends"])), world_size=m["world_size"])
        if rc != 0:
            self.failures.append(name)
            print(f"    FAILED ({rc}); log: {log}", flush=True)
        return result


def max_diff(a: list[float], b: list[float]) -> dict:
    n = min(len(a), len(b))
    if n == 0:
        return {"steps_compared": 0}
    abs_d = [abs(x - y) for x, y in zip(a[:n], b[:n])]
    return {"steps_compared": n, "max_abs_diff": max(abs_d),
            "max_rel_diff": max(d / max(abs(y), 1e-12) for d, y in zip(abs_d, b[:n])),
            "final_abs_diff": abs_d[-1]}


def equivalence(r: Runner, precision: str, steps: int) -> dict:
    config, overrides = r.preset("small")
    overrides = overrides + [f"train.steps={steps}", "train.log_every=1", f"train.ckpt_every={steps}",
                             f"train.precision={precision}"]
    runs, curves = {}, {}
    for label, nproc, parallel in (("1gpu", 1, "ddp"), ("2gpu_ddp", 2, "ddp"), ("2gpu_fsdp", 2, "fsdp")):
        res = r.train(f"eq-{precision}-{label}", nproc, config, overrides + [f"train.parallel={parallel}"])
        curves[label] = [rec["loss"] for rec in res.pop("records")]
        runs[label] = res
    return {"preset": config, "precision": precision, "steps": steps, "overrides": overrides, "runs": runs,
            "loss_curves": curves,
            "diff_vs_1gpu": {k: max_diff(curves[k], curves["1gpu"]) for k in ("2gpu_ddp", "2gpu_fsdp")},
            "diff_ddp_vs_fsdp": max_diff(curves["2gpu_fsdp"], curves["2gpu_ddp"])}


def tokens_per_s(records: list[dict]) -> float | None:
    """Median over the logging intervals after the first (which holds start-up and warm-up)."""
    rates = [rec["tokens_per_s"] for rec in records[1:]]
    return statistics.median(rates) if rates else None


def throughput(r: Runner, preset: str, steps: int, log_every: int) -> dict:
    from lenx.config import load_config

    config, overrides = r.preset(preset)
    batch = load_config(config, overrides).train.batch_size
    overrides = overrides + [f"train.steps={steps}", f"train.log_every={log_every}", f"train.ckpt_every={steps}"]
    plan = (("1gpu", 1, "ddp", batch), ("2gpu_ddp_same_global_batch", 2, "ddp", batch),
            ("2gpu_ddp", 2, "ddp", 2 * batch), ("2gpu_fsdp", 2, "fsdp", 2 * batch))
    runs = {}
    for label, nproc, parallel, global_batch in plan:
        if r.over_budget():
            runs[label] = {"skipped": "time budget spent"}
            continue
        res = r.train(f"tp-{preset}-{label}", nproc, config,
                      overrides + [f"train.parallel={parallel}", f"train.batch_size={global_batch}"])
        records = res.pop("records")
        res.update(global_batch=global_batch, tokens_per_s=tokens_per_s(records),
                   intervals=[rec["tokens_per_s"] for rec in records])
        runs[label] = res

    def efficiency(label):
        one, two = runs["1gpu"].get("tokens_per_s"), runs[label].get("tokens_per_s")
        return two / (2 * one) if one and two else None

    return {"preset": preset, "config": config, "steps": steps, "log_every": log_every, "batch_per_1gpu": batch,
            "runs": runs, "scaling_efficiency_weak_ddp": efficiency("2gpu_ddp"),
            "scaling_efficiency_weak_fsdp": efficiency("2gpu_fsdp"),
            "scaling_efficiency_strong_ddp": efficiency("2gpu_ddp_same_global_batch")}


def environment(device: str) -> dict:
    import torch

    info = {"torch": torch.__version__, "device": device, "python": sys.version.split()[0]}
    if device == "cuda":
        info.update(gpus=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                    cuda=torch.version.cuda, nccl=".".join(map(str, torch.cuda.nccl.version())))
    else:
        info["note"] = "CPU logic check: tiny models, gloo; the numbers say nothing about GPUs"
    return info


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="where the JSON results go")
    p.add_argument("--work", type=Path, default=Path("/tmp/lenx-distributed"), help="run folders and logs")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--budget", type=float, default=360, help="seconds after which optional runs are skipped")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    r = Runner(args.work, args.device, args.budget)
    cpu = args.device == "cpu"
    if not cpu:
        import torch

        if torch.cuda.device_count() < 2:
            sys.exit(f"needs 2 GPUs, sees {torch.cuda.device_count()}")
    (args.out / "env.json").write_text(json.dumps(environment(args.device), indent=2))
    # Build the corpus once, before any timed or parallel run.
    subprocess.run([sys.executable, "-m", "lenx", "prepare", "synthetic", "--root", str(args.work / "data")],
                   check=True, env=r.env, stdout=subprocess.DEVNULL)

    eq = {"bf16": equivalence(r, "bf16", 6 if cpu else 50)}
    (args.out / "equivalence.json").write_text(json.dumps(eq, indent=2))

    tp = {}
    for preset, steps, log_every in (("small", 100, 20), ("125m", 40, 10)):
        tp[preset] = throughput(r, preset, 12 if cpu else steps, 3 if cpu else log_every)
        (args.out / "throughput.json").write_text(json.dumps(tp, indent=2))

    if r.over_budget():
        eq["fp32"] = {"skipped": "time budget spent"}
    else:
        eq["fp32"] = equivalence(r, "fp32", 6 if cpu else 50)
    (args.out / "equivalence.json").write_text(json.dumps(eq, indent=2))

    # The tails of failed runs' logs, so that a failure can be read without the work folder.
    with open(args.out / "logs.txt", "w") as f:
        for name in r.failures:
            lines = (args.work / "logs" / f"{name}.log").read_text(errors="replace").splitlines()
            f.write(f"===== {name} (last 60 lines)\n" + "\n".join(lines[-60:]) + "\n")
    summary = {"elapsed_s": round(time.time() - r.t0), "failed_runs": r.failures}
    for k in ("bf16", "fp32"):
        if "diff_vs_1gpu" in eq[k]:
            summary[f"equivalence_{k}_max_abs_diff"] = {n: d.get("max_abs_diff") for n, d in eq[k]["diff_vs_1gpu"].items()}
    for preset, t in tp.items():
        summary[f"{preset}_tokens_per_s"] = {n: run.get("tokens_per_s") for n, run in t["runs"].items()}
        summary[f"{preset}_scaling_efficiency_weak_ddp"] = t["scaling_efficiency_weak_ddp"]
    print(json.dumps(summary, indent=2))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    sys.exit(1 if r.failures else 0)


if __name__ == "__main__":
    main()
