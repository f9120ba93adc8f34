#!/bin/bash
# Session 4: the bias-only GPU tests (Kerple-power parameter mode, row-max band offsets, T5 tail),
# then Kerple (log and power), ALiBi and T5
# against SDPA at 8192 and 16384.
# Usage (repository root on the device): bash results/bench/device_session4n.sh COMMIT
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
LENX_KERNEL_ERRORS=$out/errors.jsonl timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider \
    tests/test_triton_kernels.py -k "biased or routes or causal" > $out/tests.log 2>&1
timeout 150 python3 -m lenx.bench --methods sdpa,kerple,kerple-power,alibi,t5 --backends sdpa,triton --lengths 8192,16384 \
    --commit "$1" --out $out/bench_kerple_power.json > $out/bench_kerple_power.log 2>&1
tar czf $OUT/kernels.tar.gz $out
