#!/bin/bash
# Issue 19's 125M runs on one GPU: the `125m` preset at T = 128, batch 256 x 128, 3000 steps (the
# paper's recipe: lr 6e-4, 1% warm-up, cosine to lr/10, AdamW 0.9/0.95, wd 0.1, clip 1, bf16), on
# `tech` prepared with --long-test 64 (data-long/), each run evaluated right after training (125M
# checkpoints stay on the device) at 128 .. 16384, 64 windows, the last 256 tokens.
# Usage (repository root on the device, carrying .carry/tech-long.tar.xz):
#   COMMIT=<sha> JOBS="kerple:0 dapev2-kerple:0" bash scripts/device/verdict_125m.sh SECONDS
# The first call on a machine starts the jobs detached; every call waits up to SECONDS, then packs
# what has finished (no weights) into $OUT/v125.tar.gz.
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
R=runs/v125
mkdir -p $R
if [ ! -f $R/started ]; then
  touch $R/started
  [ -f data-long/tech/manifest.json ] || { mkdir -p data-long && tar xJf .carry/tech-long.tar.xz -C data-long; }
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $R/machine.txt
  {
    echo 'set -u'
    echo "R=$R"
    echo 'run() { echo "$*" >> $R/commands.txt; echo "=== $(date +%T) $*"; "$@" || echo "FAILED: $*"; }'
    for job in $JOBS; do
      m=${job%:*}; s=${job#*:}
      echo "run python3 -m lenx train -c 125m --set model.method=$m --set train.seed=$s --set train.steps=3000 \
--set train.ckpt_every=1000 --set train.val_every=250 --set train.val_batches=16 --set data.root=data-long \
--set eval.max_length=16384 --out $R/$m-s$s --no-progress"
      echo "run python3 -m lenx eval $R/$m-s$s --no-progress"
      echo "rm -rf $R/$m-s$s/ckpt"  # 1.2 GB each; the eval has run
    done
    echo 'echo "=== $(date +%T) all done"'
    echo "touch $R/done"
  } > $R/jobs.sh
  setsid nohup bash $R/jobs.sh > $R/jobs.log 2>&1 < /dev/null &
fi
end=$((SECONDS + $1))
while [ $SECONDS -lt $end ] && [ ! -f $R/done ]; do sleep 10; done
grep "^===\|FAILED\|Error\|error" $R/jobs.log | tail -n 12
tail -n 2 $R/*/metrics.jsonl 2>/dev/null | cut -c1-200
tar czf $OUT/v125.tar.gz --exclude='ckpt' --exclude='*.safetensors' --exclude='*.pt' --exclude='events.out.tfevents*' \
    --exclude='*.tmp' $R
