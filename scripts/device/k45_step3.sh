#!/bin/bash
# Issue 45 step 3, one device call (~290 s at most with the default limits):
#  1. the GPU-marked tests of tests/ops and tests/attention (JUnit XML, summary with the kernel-source
#     hash, for results/gpu-tests/): both compiled variants of the skewed kernels (F's residual on and
#     off), the residual switch's bf16 logits, the eval forward with Kerple-power at T 2048 off the
#     Gluon forward (finite, close to float64);
#  2. the 125m training step, kerple against dapev2-kerple, at 512 x 32 and 2048 x 8 (profiler GPU
#     time, peak memory): Kerple-log's tables need no residual, so the step-1 flash kernels run;
#  3. `lenx bench` at 8192 and 16384 (B 1, H 12, d 64): sdpa, kerple, dapev2-kerple; its fwd rows are
#     the eval forward (`fwd_kernel` says which kernel, `fwd_kernel_note` why not Gluon where so).
# Usage (repository root on the device): COMMIT=<sha> OUT=/some/dir bash scripts/device/k45_step3.sh
# Limits (seconds, each a `timeout`): TESTS_S (140), STEP_S (45, per shape), EVAL_S (60).
set -o pipefail
TESTS_S=${TESTS_S:-140} STEP_S=${STEP_S:-45} EVAL_S=${EVAL_S:-60}
export PYTHONPATH=src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
mkdir -p "$OUT/gpu-tests" "$OUT/bench"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu-tests/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee "$OUT/versions.txt"

LENX_KERNEL_ERRORS=$OUT/gpu-tests/errors.jsonl timeout "$TESTS_S" python3 -m pytest -q -n 12 -m gpu -p no:cacheprovider \
    --junitxml="$OUT/gpu-tests/junit.xml" tests/ops tests/attention 2>&1 | tail -25 | tee "$OUT/gpu-tests/pytest.log"
python3 scripts/device/gpu_summary.py "$OUT/gpu-tests/junit.xml" "$OUT/gpu-tests/summary.json" \
    "bash scripts/device/k45_step3.sh (pytest -n 12 -m gpu tests/ops tests/attention)"

for shape in 32x512 8x2048; do
    B=${shape%x*} T=${shape#*x}
    timeout "$STEP_S" python3 -m lenx bench --train-step --methods kerple,dapev2-kerple --batch "$B" --seq-len "$T" \
        --steps 6 --warmup 2 --profile-steps 2 --commit "$COMMIT" -o "$OUT/bench/train_step_T$T.json" 2>&1 \
        | grep -v -i warn | tail -12 | tee "$OUT/bench/train_step_T$T.log"
done

timeout "$EVAL_S" python3 -m lenx bench --methods sdpa,kerple,dapev2-kerple --backends sdpa,triton \
    --lengths 8192,16384 --batch 1 --heads 12 --head-dim 64 --commit "$COMMIT" -o "$OUT/bench/eval.json" 2>&1 \
    | grep -v -i warn | tail -20 | tee "$OUT/bench/eval.log"
exit 0
