#!/bin/bash
# The reproduction on the device (issue 7): bash scripts/repro/device.sh SECONDS
# On a fresh machine: unpack the carried corpora (carry/data.tar.xz: tech + books, tokenized), write
# the plan and start run_jobs.py detached (setsid), so the jobs outlive this call. Every call then
# waits SECONDS, reporting progress, and packs every finished file except checkpoints into
# $OUT/repro.tar.gz. The next call (same machine) picks up where this one left; on a fresh machine
# the jobs listed in carry/done.txt (pack_data.sh writes it from results/repro/status.json) are
# skipped, and CHE jobs resume from the logs committed under results/repro/che/runs/.
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
export LENX_GIT_COMMIT=$(cat carry/commit.txt)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p runs/repro
pid_file=runs/repro/scheduler.pid
if ! { [ -f $pid_file ] && kill -0 "$(cat $pid_file)" 2>/dev/null; }; then
  if [ ! -f data/books/manifest.json ]; then
    python3 -c "import tarfile; tarfile.open('carry/data.tar.xz').extractall('data')" || exit 1
  fi
  # CHE logs of an earlier session: the jobs that were cut off resume from them (run_che skips done runs)
  for log in results/repro/che/runs/*/runs.jsonl; do
    [ -f "$log" ] || continue
    dest=runs/repro/che/$(basename "$(dirname "$log")")
    [ -f "$dest/runs.jsonl" ] || { mkdir -p "$dest" && cp "$log" "$dest/"; }
  done
  python3 scripts/repro/plan.py > runs/repro/plan.json || exit 1
  { nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)"; } \
    > runs/repro/machine.txt 2>&1
  # REPRO_GPUS: use only the first N GPUs (the others stay free for other work of the same call)
  setsid nohup python3 scripts/repro/run_jobs.py runs/repro/plan.json --gpus "${REPRO_GPUS:-$(nvidia-smi -L | wc -l)}" \
    --skip carry/done.txt > runs/repro/scheduler.log 2>&1 < /dev/null &
  echo $! > $pid_file
  echo "started the scheduler (pid $(cat $pid_file))"
fi
summary() {
  python3 - <<'PY'
import json, collections
s = json.load(open("runs/repro/status.json"))["jobs"]
c = collections.Counter(j["state"] for j in s)
print(dict(c), "| running:", ", ".join(j["id"] for j in s if j["state"] == "running"))
for j in s:
    if j["state"] == "failed":
        tail = open(j["run"] + "/job.log", errors="replace").read().strip().splitlines()[-3:]
        print("FAILED", j["id"], *tail, sep="\n  ")
PY
}
end=$((SECONDS + $1))
while [ $SECONDS -lt $end ]; do
  sleep $(( end - SECONDS < 60 ? (end - SECONDS > 0 ? end - SECONDS : 0) : 60 ))
  echo "--- $(date +%T)"; summary
done
tail -n 5 runs/repro/scheduler.log
tar czf $OUT/repro.tar.gz --exclude='ckpt*' --exclude='events.out.tfevents*' runs/repro
cp runs/repro/status.json $OUT/
ls -la $OUT
