#!/bin/bash
# The conv kernels' tile settings at B 32, T 512, one setting per process (an illegal address
# poisons the CUDA context of every later launch in the same process).
# Usage (repository root on the device): OUT=/some/dir bash scripts/device/skewed_sweep.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p "$OUT/sweep"
for setting in conv_dy:8,16,8,1 conv_dy:4,16,4,1 conv_dy:8,16,4,1 conv_dy:16,16,8,1 conv_dy:4,32,8,1 \
    conv_dy:8,32,8,1 conv_dy:2,32,4,1 conv_dy:8,32,4,1 conv_dy:16,32,8,1 conv_z:16,16,8,1 conv_z:8,32,8,1 \
    conv_f:16,16,8,1 conv_f:8,32,8,1 conv_dx:16,16,8,1 conv_dx:8,32,8,1; do
    kernel=${setting%%:*} tiles=${setting#*:}
    timeout 60 python3 scripts/tune/time_skewed.py "$OUT/sweep/${kernel}_${tiles//,/_}.json" 32x512 sweep "$kernel" "$tiles" \
        2>&1 | grep "^sweep" | tee -a "$OUT/sweep.log"
done
