#!/bin/bash
# Two jobs of one device call, one a GPU, side by side: GPU0 and GPU1 are bash command strings (each may
# run several scripts in turn); each runs with CUDA_VISIBLE_DEVICES set to its GPU and logs to
# $OUT/gpuN.log. Held time counts once for both GPUs of an nvidia-h200-x2 machine, so a call that
# pairs the GPU suite with a timing job or a plan's runs costs what either alone would. Waits for both.
# Usage (repository root on the device): OUT=/some/dir GPU0='...' GPU1='...' bash scripts/device/two_gpus.sh
: "${OUT:?OUT is the folder that comes back}" "${GPU0:?GPU0 is a command}" "${GPU1:?GPU1 is a command}"
mkdir -p "$OUT"
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
CUDA_VISIBLE_DEVICES=0 bash -c "$GPU0" > "$OUT/gpu0.log" 2>&1 &
first=$!
CUDA_VISIBLE_DEVICES=1 bash -c "$GPU1" > "$OUT/gpu1.log" 2>&1 &
second=$!
wait $first; rc0=$?
wait $second; rc1=$?
echo "gpu0 rc=$rc0 gpu1 rc=$rc1"
