#!/bin/bash
# A plan of jobs (scripts/repro/plan.py) on the device: [PLAN=repro|controls|epoch|recipe|newer|verdict2] bash scripts/repro/device.sh SECONDS
#   repro (issue 7): carries carry/data.tar.xz (tech + books, pack_data.sh) and carry/commit.txt;
#   controls (issue 19): carries .carry/tech.tar.xz (data/tech) and .carry/tech-long.tar.xz
#   (data-long/tech, for the 125M runs); the commit comes in $COMMIT.
#   epoch (issue 29 step 4): the sharded `code` corpus, carried over earlier calls of the same machine
#   as .carry/code (scripts/data/pack_corpus.py pack of its top-level files) and .carry/shards/*.bin.xz
#   (`xz -k` of the shards scripts/data/shards_for_steps.py lists); the commit comes in $COMMIT.
#   recipe and verdict2 (issue 44) and newer (issues 42, 43: `small` runs reading shard 00000 only) likewise.
# On a fresh machine: unpack the corpora, write the plan and start run_jobs.py detached (setsid), so
# the jobs outlive this call. Every call then waits SECONDS, reporting progress, and packs every
# finished file except checkpoints into $OUT/$PLAN.tar.gz. The next call (same machine) picks up where
# this one left; on a fresh machine the jobs listed in $SKIP (default for PLAN=repro: carry/done.txt,
# which pack_data.sh writes from results/repro/status.json; for epoch: results/epoch/done.txt, the runs
# committed under results/epoch/runs; for controls: none) are skipped, and CHE jobs resume from the logs committed
# under results/repro/che/runs/. LM_SLOTS: training runs sharing one GPU (default 1). REPRO_GPUS: the GPUs
# used (default all); the epoch plan's runs take one GPU each, so REPRO_GPUS=4 runs four at once.
# Collect what came back: scripts/repro/collect.py (repro, controls), collect_epoch.py (epoch),
# collect_verdict2.py (verdict2).
set -u
PLAN=${PLAN:-repro}
# the repro plan's finished jobs (carry/done.txt) are not the controls'
case $PLAN in repro) default_skip=carry/done.txt ;; epoch) default_skip=results/epoch/done.txt ;;
  recipe) default_skip=results/recipe/done.txt ;; newer) default_skip=results/newer/done.txt ;;
  verdict2) default_skip=results/verdict2/done.txt ;;
  *) default_skip="" ;; esac
R=runs/$PLAN
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
export LENX_GIT_COMMIT=${COMMIT:-$(cat carry/commit.txt)}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $R
pid_file=$R/scheduler.pid
if ! { [ -f $pid_file ] && kill -0 "$(cat $pid_file)" 2>/dev/null; }; then
  if [ "$PLAN" = repro ]; then
    [ -f data/books/manifest.json ] || python3 -c "import tarfile; tarfile.open('carry/data.tar.xz').extractall('data')" \
      || exit 1
    # CHE logs of an earlier session: the jobs that were cut off resume from them (run_che skips done runs)
    for log in results/repro/che/runs/*/runs.jsonl; do
      [ -f "$log" ] || continue
      dest=$R/che/$(basename "$(dirname "$log")")
      [ -f "$dest/runs.jsonl" ] || { mkdir -p "$dest" && cp "$log" "$dest/"; }
    done
  elif [ "$PLAN" = epoch ] || [ "$PLAN" = recipe ] || [ "$PLAN" = newer ] || [ "$PLAN" = verdict2 ] \
       || [ "$PLAN" = ssmax_init ]; then
    # issue 29 step 4: the sharded `code` corpus came in earlier calls: .carry/code (pack_corpus.py's
    # pieces of its top-level files) and .carry/shards/*.bin.xz (the train shards the runs read)
    [ -f data/code/manifest.json ] || python3 scripts/data/pack_corpus.py unpack .carry/code data/code || exit 1
    mkdir -p data/code/train.shards
    for f in .carry/shards/*.bin.xz; do
      n=data/code/train.shards/$(basename "$f" .xz)
      if [ ! -f "$n" ]; then xz -dc "$f" > "$n.part" && mv "$n.part" "$n" || exit 1; fi
    done
    python3 -m lenx shard code --check || exit 1
  else
    [ -f data/tech/manifest.json ] || { mkdir -p data && tar xJf .carry/tech.tar.xz -C data; } || exit 1
    [ -f data-long/tech/manifest.json ] || { mkdir -p data-long && tar xJf .carry/tech-long.tar.xz -C data-long; } \
      || exit 1
  fi
  python3 scripts/repro/plan.py $PLAN > $R/plan.json || exit 1
  { nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)"; } \
    > $R/machine.txt 2>&1
  # REPRO_GPUS: use only N GPUs from REPRO_FIRST_GPU (default 0; the others stay free for other work)
  setsid nohup python3 scripts/repro/run_jobs.py $R/plan.json --gpus "${REPRO_GPUS:-$(nvidia-smi -L | wc -l)}" \
    --first-gpu "${REPRO_FIRST_GPU:-0}" \
    --lm-slots "${LM_SLOTS:-1}" --status $R/status.json --skip "${SKIP:-$default_skip}" \
    > $R/scheduler.log 2>&1 < /dev/null &
  echo $! > $pid_file
  echo "started the scheduler (pid $(cat $pid_file))"
fi
summary() {
  STATUS=$R/status.json python3 - <<'PY'
import json, collections, os
s = json.load(open(os.environ["STATUS"]))["jobs"]
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
  grep -q '"state": "\(pending\|running\)"' $R/status.json || break
done
tail -n 5 $R/scheduler.log
tar czf $OUT/$PLAN.tar.gz --exclude='ckpt*' --exclude='events.out.tfevents*' --exclude='*.safetensors' $R
cp $R/status.json $OUT/
ls -la $OUT
