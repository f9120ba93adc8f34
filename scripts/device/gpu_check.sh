#!/bin/bash
# One device call: the GPU test suite (JUnit XML + the hash of the kernel sources it ran, for
# results/gpu-tests/), then `lenx bench` of the fused kernels against SDPA at 8192 and 16384.
# Usage (repository root on the device, no install): COMMIT=<sha> OUT=/some/dir [BENCH=0] bash scripts/device/gpu_check.sh
# (BENCH=0: the tests only)
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
mkdir -p "$OUT/gpu-tests" "$OUT/bench"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
LENX_KERNEL_ERRORS=$OUT/gpu-tests/errors.jsonl timeout 470 python3 -m pytest -q -n 8 -p no:cacheprovider \
    --junitxml="$OUT/gpu-tests/junit.xml" tests/ops tests/attention \
    tests/test_functional.py 2>&1 | tail -15 | tee "$OUT/gpu-tests/pytest.log"
python3 scripts/device/gpu_summary.py "$OUT/gpu-tests/junit.xml" "$OUT/gpu-tests/summary.json" \
    "bash scripts/device/gpu_check.sh (pytest -n 8 tests/ops tests/attention tests/test_functional.py)"
[ "${BENCH:-1}" = 1 ] && timeout 200 python3 -m lenx bench --methods sdpa,kerple,dapev2-kerple,stickbreaking --backends sdpa,triton \
    --lengths 8192,16384 --commit "$COMMIT" -o "$OUT/bench/bench.json" 2>&1 | grep -v -i "warn" | tail -25 \
    | tee "$OUT/bench/bench.log"
