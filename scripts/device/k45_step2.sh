#!/bin/bash
# Issue 45 step 2, one device call (~330 s at most with the default limits):
#  1. the GPU-marked tests of tests/ops and tests/attention (JUnit XML, summary with the kernel-source
#     hash, for results/gpu-tests/): the skewed kernels at d 128, the large-bias logits (F's residual),
#     the host-table cache's routing;
#  2. the 125m training step, kerple against dapev2-kerple, at 512 x 32 and 2048 x 8 (profiler GPU
#     time, peak memory; the delta kernel and the residual are in the step);
#  3. `lenx bench` at 8192 and 16384 (B 1, H 12, d 64): sdpa, kerple, dapev2-kerple; its fwd rows are
#     the eval forward (the Gluon kernel with the host tables cached), then the same dapev2-kerple
#     rows with the cache off (tables.MAX_ENTRIES = 0, in process) beside sdpa: the cache's effect.
# Usage (repository root on the device): COMMIT=<sha> OUT=/some/dir bash scripts/device/k45_step2.sh
# Limits (seconds, each a `timeout`): TESTS_S (150), STEP_S (45, per shape), EVAL_S (60), EVAL_OFF_S
# (40; 0 skips the cache-off run).
set -o pipefail
TESTS_S=${TESTS_S:-150} STEP_S=${STEP_S:-45} EVAL_S=${EVAL_S:-60} EVAL_OFF_S=${EVAL_OFF_S:-40}
export PYTHONPATH=src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
mkdir -p "$OUT/gpu-tests" "$OUT/bench"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu-tests/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee "$OUT/versions.txt"

LENX_KERNEL_ERRORS=$OUT/gpu-tests/errors.jsonl timeout "$TESTS_S" python3 -m pytest -q -n 12 -m gpu -p no:cacheprovider \
    --junitxml="$OUT/gpu-tests/junit.xml" tests/ops tests/attention 2>&1 | tail -25 | tee "$OUT/gpu-tests/pytest.log"
python3 scripts/device/gpu_summary.py "$OUT/gpu-tests/junit.xml" "$OUT/gpu-tests/summary.json" \
    "bash scripts/device/k45_step2.sh (pytest -n 12 -m gpu tests/ops tests/attention)"

for shape in 32x512 8x2048; do
    B=${shape%x*} T=${shape#*x}
    timeout "$STEP_S" python3 -m lenx bench --train-step --methods kerple,dapev2-kerple --batch "$B" --seq-len "$T" \
        --steps 6 --warmup 2 --profile-steps 2 --commit "$COMMIT" -o "$OUT/bench/train_step_T$T.json" 2>&1 \
        | grep -v -i warn | tail -12 | tee "$OUT/bench/train_step_T$T.log"
done

timeout "$EVAL_S" python3 -m lenx bench --methods sdpa,kerple,dapev2-kerple --backends sdpa,triton \
    --lengths 8192,16384 --batch 1 --heads 12 --head-dim 64 --commit "$COMMIT" -o "$OUT/bench/eval.json" 2>&1 \
    | grep -v -i warn | tail -20 | tee "$OUT/bench/eval.log"

[ "$EVAL_OFF_S" -gt 0 ] && timeout "$EVAL_OFF_S" python3 - --methods sdpa,dapev2-kerple --backends sdpa,triton \
    --lengths 8192,16384 --batch 1 --heads 12 --head-dim 64 --commit "$COMMIT" -o "$OUT/bench/eval_nocache.json" \
    <<'PY' 2>&1 | grep -v -i warn | tail -14 | tee "$OUT/bench/eval_nocache.log"
import sys
from lenx.ops.dape_v2 import tables
tables.MAX_ENTRIES = 0  # every call rebuilds its host tables, as before the cache
print("host-table cache off")
from lenx.cli import main
sys.exit(main(["bench", *sys.argv[1:]]))
PY
exit 0
