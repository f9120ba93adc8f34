#!/bin/bash
# One device call for the skewed DAPE V2 training kernels: the whole GPU suite
# (scripts/device/gpu_check.sh, BENCH=0, ~400 s) and the per-kernel times at the training shapes.
# Usage (repository root on the device): COMMIT=<sha> OUT=/some/dir bash scripts/device/skewed_check.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p "$OUT"
BENCH=0 bash scripts/device/gpu_check.sh
timeout 100 python3 scripts/tune/time_skewed.py "$OUT/skewed_times.json" 2>&1 | grep -v -i warn | tee "$OUT/skewed_times.log"
