#!/bin/bash
# Session 4, after the review: the whole fused-kernel GPU suite at the final code, then every fused
# kernel against SDPA at 8192 (d 64).
# Usage (repository root on the device): bash results/bench/device_session4o.sh COMMIT
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
LENX_KERNEL_ERRORS=$out/errors.jsonl timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider \
    tests/test_triton_kernels.py > $out/tests.log 2>&1
timeout 240 python3 -m lenx.bench --methods sdpa,kerple,kerple-power,alibi,t5,stickbreaking,dapev2-kerple \
    --backends sdpa,triton --lengths 8192 --commit "$1" --out $out/bench_review.json > $out/bench_review.log 2>&1
tar czf $OUT/kernels.tar.gz $out
