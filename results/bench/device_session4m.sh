#!/bin/bash
# Session 4: the bias-only GPU tests with CONFIG_WIDE (d = 128 tiles), then Kerple at d = 128 and 64.
# Usage (repository root on the device): bash results/bench/device_session4m.sh COMMIT
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
LENX_KERNEL_ERRORS=$out/errors.jsonl timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider \
    tests/test_triton_kernels.py -k "biased or routes" > $out/tests.log 2>&1
timeout 150 python3 -m lenx.bench --methods sdpa,kerple --backends sdpa,triton --head-dim 128 --lengths 8192,16384 \
    --commit "$1" --out $out/bench_kerple_d128.json > $out/bench_kerple_d128.log 2>&1
tar czf $OUT/kernels.tar.gz $out
