#!/bin/bash
# Issues 15 and 18 on one GPU: decoding speed of a 125m model, then (detached, so it outlives the call)
# the small T = 128 models of the reproduction retrained on tech (rope x 3 seeds, kerple, dapev2-kerple,
# stickbreaking; the same command as results/repro), rope evaluated with every RoPE extension, a PI
# fine-tune of rope-s0 at 4x the length, and passkey / copy retrieval on every model.
# Usage (repository root on the device, carrying .carry/tech.tar.xz): COMMIT=<sha> bash scripts/device/extension_retrieval.sh SECONDS
# Every call waits SECONDS (the first also times decoding first), then packs what has finished into $OUT.
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
R=runs/ext
mkdir -p $R
if [ ! -f $R/started ]; then
  touch $R/started
  [ -f data/tech/manifest.json ] || python3 -c "import tarfile; tarfile.open('.carry/tech.tar.xz').extractall('data')"
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $R/machine.txt
  # decoding speed first, alone on the GPU
  timeout 400 python3 scripts/device/decode_speed.py --contexts 1024,8192,32768 -o $R/decode_speed.json > $R/decode_speed.log 2>&1
  cat > $R/jobs.sh <<'JOBS'
set -u
R=runs/ext
run() { echo "$*" >> $R/commands.txt; echo "=== $(date +%T) $*"; "$@" || echo "FAILED: $*"; }
train() {  # method seed [extra --set ...]
  local m=$1 s=$2; shift 2
  run python3 -m lenx train -c small --set model.method=$m --set train.seed=$s --set train.steps=2000 \
    --set train.seq_len=128 --set train.batch_size=64 --set train.ckpt_every=1000 --set data.corpus=tech \
    --set eval.max_length=16384 "$@" --out $R/$m-s$s --no-progress
}
tasks() { for t in copy passkey; do run python3 -m lenx eval $1 --task $t --lengths 128,256,512,1024,2048,4096,8192,16384 --samples 8 "${@:2}" --no-progress; done; }
for m in rope kerple dapev2-kerple stickbreaking; do train $m 0; done
for scaling in none pi ntk dynamic-ntk yarn; do
  if [ $scaling = none ]; then run python3 -m lenx eval $R/rope-s0 --no-progress
  else run python3 -m lenx eval $R/rope-s0 --rope-scaling $scaling --no-progress; fi
done
for m in kerple dapev2-kerple stickbreaking; do run python3 -m lenx eval $R/$m-s0 --no-progress; done
for m in rope kerple dapev2-kerple stickbreaking; do tasks $R/$m-s0; done
tasks $R/rope-s0 --rope-scaling yarn
# PI's recipe, scaled down: 200 steps at 4x the length (the same tokens per step), scale 4, the
# pre-training's final learning rate held constant
run python3 -m lenx train -c small --set model.method=rope --set train.init_from=$R/rope-s0 \
  --set model.rope_scaling=pi --set model.rope_scaling_factor=4.0 --set model.rope_train_len=128 \
  --set train.seq_len=512 --set train.batch_size=16 --set train.steps=200 --set train.lr=1e-4 \
  --set train.min_lr_ratio=1.0 --set train.warmup_frac=0.05 --set train.ckpt_every=200 --set data.corpus=tech \
  --set eval.max_length=16384 --out $R/rope-pi-ft-s0 --no-progress
run python3 -m lenx eval $R/rope-pi-ft-s0 --no-progress
tasks $R/rope-pi-ft-s0
for s in 1 2; do
  train rope $s
  run python3 -m lenx eval $R/rope-s$s --no-progress
  for scaling in pi ntk dynamic-ntk yarn; do run python3 -m lenx eval $R/rope-s$s --rope-scaling $scaling --no-progress; done
done
echo "=== $(date +%T) all done"
touch $R/done
JOBS
  setsid nohup bash $R/jobs.sh > $R/jobs.log 2>&1 < /dev/null &
fi
end=$((SECONDS + $1))
while [ $SECONDS -lt $end ] && [ ! -f $R/done ]; do sleep 15; done
grep "^===\|FAILED" $R/jobs.log | tail -n 8
tar czf $OUT/ext.tar.gz --exclude='ckpt*' --exclude='events.out.tfevents*' --exclude='*.tmp' $R
ls -la $OUT
