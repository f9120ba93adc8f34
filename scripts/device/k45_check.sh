#!/bin/bash
# Issue 45 step 1, one device call: the GPU-marked kernel tests (tests/ops, tests/attention; JUnit XML
# and the kernel-source hash for results/gpu-tests/), then the 125m training step of kerple against
# dapev2-kerple at 512 x 32 and 2048 x 8 (profiler GPU time, peak memory) for results/bench/.
# Usage (repository root on the device): COMMIT=<sha> OUT=/some/dir bash scripts/device/k45_check.sh
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
mkdir -p "$OUT/gpu-tests" "$OUT/bench"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu-tests/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee "$OUT/versions.txt"
LENX_KERNEL_ERRORS=$OUT/gpu-tests/errors.jsonl timeout 250 python3 -m pytest -q -n 12 -m gpu -p no:cacheprovider \
    --junitxml="$OUT/gpu-tests/junit.xml" tests/ops tests/attention 2>&1 | tail -25 | tee "$OUT/gpu-tests/pytest.log"
python3 scripts/device/gpu_summary.py "$OUT/gpu-tests/junit.xml" "$OUT/gpu-tests/summary.json" \
    "bash scripts/device/k45_check.sh (pytest -n 12 -m gpu tests/ops tests/attention)"
for shape in 32x512 8x2048; do
    B=${shape%x*} T=${shape#*x}
    timeout 70 python3 -m lenx bench --train-step --methods kerple,dapev2-kerple --batch "$B" --seq-len "$T" \
        --steps 6 --warmup 2 --profile-steps 2 --commit "$COMMIT" -o "$OUT/bench/train_step_T$T.json" 2>&1 \
        | grep -v -i warn | tail -12 | tee "$OUT/bench/train_step_T$T.log"
done
