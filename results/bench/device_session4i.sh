#!/bin/bash
# Session 4, last call: the whole fused-kernel GPU suite at the final commit, then every fused
# kernel against SDPA at 8192 and 16384 (d 64), as a check that the recorded figures hold there.
# Usage (repository root on the device): bash results/bench/device_session4i.sh COMMIT
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader > $out/gpu.txt
LENX_KERNEL_ERRORS=$out/errors.jsonl timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider \
    tests/test_triton_kernels.py > $out/tests.log 2>&1
timeout 300 python3 -m lenx.bench --methods sdpa,kerple,stickbreaking,dapev2-kerple --backends sdpa,triton \
    --lengths 8192,16384 --commit "$1" --out $out/bench_final.json > $out/bench_final.log 2>&1
tar czf $OUT/kernels.tar.gz $out
