#!/bin/bash
# One device call for the skewed DAPE V2 training kernels: the conv-gradient check of the kernel
# against the previous version (when src/lenx/ops/dape_v2/_skewed_old.py is carried), the whole GPU
# suite (scripts/device/gpu_check.sh, BENCH=0) and the per-kernel times at the training shapes.
# Usage (repository root on the device): COMMIT=<sha> OUT=/some/dir bash scripts/device/skewed_check.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p "$OUT"
if [ -f src/lenx/ops/dape_v2/_skewed_old.py ]; then
    SKEWED_MODULE=lenx.ops.dape_v2._skewed_old timeout 45 python3 scripts/tune/debug_skewed.py 2>&1 | grep -v -i warn > "$OUT/debug_old.log"
    rm src/lenx/ops/dape_v2/_skewed_old.py  # not part of the kernel sources the suite hashes
fi
timeout 45 python3 scripts/tune/debug_skewed.py 2>&1 | grep -v -i warn | tee "$OUT/debug.log"
BENCH=0 bash scripts/device/gpu_check.sh
timeout 100 python3 scripts/tune/time_skewed.py "$OUT/skewed_times.json" 2>&1 | grep -v -i warn | tee "$OUT/skewed_times.log"
