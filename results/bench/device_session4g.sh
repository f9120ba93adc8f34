#!/bin/bash
# Session 4: Kerple's r1, r2 gradients straight from the bias-only dq kernel (no table gradient).
# The bias-only GPU tests (with the new Kerple-parameter cases), then the probe and the Kerple
# benchmark (d 64 at 8192/16384/32768, d 128 at 8192/16384).
# Usage (repository root on the device): bash results/bench/device_session4g.sh COMMIT
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
LENX_KERNEL_ERRORS=$out/errors.jsonl timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider \
    tests/test_triton_kernels.py -k "biased or routes or causal" > $out/tests.log 2>&1
timeout 240 python3 -m lenx.bench --probe --methods sdpa,kerple --backends sdpa,triton --lengths 8192,16384,32768 \
    --commit "$1" --out $out/bench_kerple_d64.json > $out/bench_kerple_d64.log 2>&1
timeout 120 python3 -m lenx.bench --methods sdpa,kerple --backends sdpa,triton --head-dim 128 --lengths 8192,16384 \
    --commit "$1" --out $out/bench_kerple_d128.json > $out/bench_kerple_d128.log 2>&1
tar czf $OUT/kernels.tar.gz $out
