#!/bin/bash
# Session 27, call 2 (nvidia-h200-x2). GPU 1: land26's GPU suite again, then the flash sweep.
# GPU 0: kcg26's K_C GPU tests and timing (main + its four new files, in /tmp/kc), then the
# ssmax_init plan (four small runs at once; the scheduler outlives the call).
set -u
COMMIT=${COMMIT:?}
(
  CUDA_VISIBLE_DEVICES=1 COMMIT=$COMMIT OUT=$OUT STAGES="tests" TESTS_S=290 bash scripts/device/landing_check.sh > "$OUT/landing.out" 2>&1
  mkdir -p /tmp/sweep
  CUDA_VISIBLE_DEVICES=1 OUT=/tmp/sweep KERNELS=flash timeout $((575 - SECONDS)) bash scripts/device/skewed_sweep.sh > /tmp/sweep/out.log 2>&1
  (cd /tmp && tar czf "$OUT/sweep.tar.gz" sweep)
) &
(
  K=/tmp/kc; rm -rf $K; mkdir -p $K "$OUT/kc"; cp -r src tests scripts pyproject.toml $K/; cp -r .carry/kcg26/. $K/
  (cd $K && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu \
      tests/ops/test_dape_v2_conv_bwd.py --junitxml="$OUT/kc/kc.xml" > "$OUT/kc/pytest.log" 2>&1
   CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 120 python3 scripts/tune/time_conv_bwd.py "$OUT/kc/kc_times.json" \
      > "$OUT/kc/times.log" 2>&1)
  (cd "$OUT" && tar czf kc.tar.gz kc && rm -rf kc)
  COMMIT=$COMMIT PLAN=ssmax_init REPRO_GPUS=1 LM_SLOTS=4 bash scripts/repro/device.sh $((560 - SECONDS)) > "$OUT/ssmax.out" 2>&1
  rm -f "$OUT/status.json"
) &
wait
ls -la "$OUT"
