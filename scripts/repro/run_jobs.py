"""Run a plan of shell jobs (plan.py) on the GPUs of one machine until every job has run.

Slots per GPU: `--lm-slots` "lm" jobs (training runs; small models leave an H200 mostly idle, so
several can share it) and `--small-slots` "small" jobs (CHE processes) at a time; "exclusive" jobs
(timing, the 125M runs of the controls) run one after another on the last GPU, alone, and nothing else
starts there until they have all run; a "solo" job (the epoch plan's 125M runs) takes any GPU with
nothing else on it, alone, so a machine of N GPUs runs N of them at once. Jobs start in plan order.
Each job runs in its own process group with one GPU (CUDA_VISIBLE_DEVICES), logs to <run>/job.log,
and its exact command goes to <run>/command.txt. status.json (rewritten after every change) says
what ran, where and for how long. Jobs listed in --skip (ids, one per line) are not run: they
finished on an earlier machine.
"""

import argparse
import json
import os
from pathlib import Path
import subprocess
import sys
import time

KINDS = ("lm", "small", "exclusive", "solo")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("plan")
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--first-gpu", type=int, default=0, help="the first of the --gpus GPUs used (others: other work)")
    p.add_argument("--lm-slots", type=int, default=1)
    p.add_argument("--small-slots", type=int, default=3)
    p.add_argument("--status", default="runs/repro/status.json")
    p.add_argument("--skip", default=None)
    args = p.parse_args()
    if args.first_gpu < 0 or args.gpus < 1:
        print(f"error: --gpus must be >= 1 and --first-gpu >= 0 (got {args.gpus}, {args.first_gpu})", file=sys.stderr)
        sys.exit(2)
    # GPU numbers index the GPUs this process may see: an inherited CUDA_VISIBLE_DEVICES (a job of
    # scripts/device/two_gpus.sh) is kept, not replaced by the device's own numbering
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()] or None
    if visible is not None and args.first_gpu + args.gpus > len(visible):
        print(f"error: --first-gpu {args.first_gpu} --gpus {args.gpus} asks for more GPUs than CUDA_VISIBLE_DEVICES "
              f"lists ({','.join(visible)})", file=sys.stderr)
        sys.exit(2)

    jobs = json.loads(Path(args.plan).read_text())
    odd = sorted({j["kind"] for j in jobs} - set(KINDS))
    if odd:
        raise SystemExit(f"run_jobs.py: unknown job kind {', '.join(odd)} in {args.plan} (kinds: {', '.join(KINDS)})")
    skip = set(Path(args.skip).read_text().split()) if args.skip and Path(args.skip).exists() else set()
    unknown = sorted(skip - {j["id"] for j in jobs})
    if unknown:  # a job renamed in the plan would run again: say so
        print(f"[jobs] --skip ids not in the plan, ignored: {' '.join(unknown)}", flush=True)
    status = {j["id"]: {"state": "skipped" if j["id"] in skip else "pending", **j} for j in jobs}
    pending = [j for j in jobs if j["id"] not in skip]
    threads = str(max(1, (os.cpu_count() or 8) // (args.gpus * (args.lm_slots + args.small_slots))))
    running: dict[str, tuple[subprocess.Popen, int, str]] = {}  # id -> (process, gpu, kind)
    exclusive_gpu = args.gpus - 1 if any(j["kind"] == "exclusive" for j in pending) else None

    def save():
        tmp = Path(args.status + ".tmp")
        tmp.write_text(json.dumps({"updated": time.time(), "jobs": list(status.values())}, indent=1))
        tmp.replace(args.status)

    def free(gpu: int, kind: str) -> bool:
        here = [k for (_, g, k) in running.values() if g == gpu]
        if "exclusive" in here or "solo" in here:
            return False
        if kind == "exclusive":
            return not here
        if gpu == exclusive_gpu:  # held back until the exclusive job has run
            return False
        if kind == "solo":
            return not here
        return here.count(kind) < (args.lm_slots if kind == "lm" else args.small_slots)

    Path(args.status).parent.mkdir(parents=True, exist_ok=True)
    save()
    while pending or running:
        for job in list(pending):
            gpus = [exclusive_gpu] if job["kind"] == "exclusive" else range(args.gpus)
            gpu = next((g for g in gpus if free(g, job["kind"])), None)
            if gpu is None:
                continue
            pending.remove(job)
            run = Path(job["run"])
            run.mkdir(parents=True, exist_ok=True)
            (run / "command.txt").write_text(job["cmd"] + "\n")
            device = str(args.first_gpu + gpu) if visible is None else visible[args.first_gpu + gpu]
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=device, OMP_NUM_THREADS=threads,
                       PYTHONUNBUFFERED="1")
            log = open(run / "job.log", "a")
            proc = subprocess.Popen(["bash", "-c", job["cmd"]], stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            running[job["id"]] = (proc, gpu, job["kind"])
            status[job["id"]].update(state="running", gpu=gpu, start=time.time())
            print(f"[jobs] start {job['id']} on GPU {gpu}", flush=True)
            save()
        time.sleep(1)
        for jid, (proc, gpu, kind) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[jid]
            if kind == "exclusive" and not any(j["kind"] == "exclusive" for j in pending):
                exclusive_gpu = None
            s = status[jid]
            s.update(state="done" if proc.returncode == 0 else "failed", returncode=proc.returncode,
                     seconds=round(time.time() - s["start"], 1))
            print(f"[jobs] {s['state']} {jid} ({s['seconds']} s)", flush=True)
            save()
    print("[jobs] all done", flush=True)


if __name__ == "__main__":
    main()
