#!/bin/bash
# Session 27, call 1 (nvidia-h200-x2): land26's GPU suite and rows on GPU 0, ws26_check on GPU 1.
set -u
COMMIT=${COMMIT:?}
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
( CUDA_VISIBLE_DEVICES=1 COMMIT=$COMMIT OUT=$OUT TESTS_S=150 bash scripts/device/ws26_check.sh > "$OUT/ws26.out" 2>&1 ) &
CUDA_VISIBLE_DEVICES=0 COMMIT=$COMMIT OUT=$OUT STAGES="tests layer extra" TESTS_S=330 LAYER_S=80 \
EXTRA='timeout 120 python3 -m lenx bench --train-step --methods kerple,ssmax-kerple,rope,ssmax-rope,mta --batch 32 --seq-len 512 --steps 6 --warmup 2 --profile-steps 2 --top-kernels 15 --commit $COMMIT -o $OUT/landing/bench/train_step_T512.json' \
    bash scripts/device/landing_check.sh > "$OUT/landing.out" 2>&1
wait
ls -la "$OUT"
