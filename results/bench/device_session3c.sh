#!/bin/bash
# Session 3, DAPE V2 heavy-first launch order: the DAPE V2 GPU tests, then DAPE V2 against SDPA.
# Usage (repository root on the device): bash results/bench/device_session3c.sh COMMIT
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_triton_kernels.py -k "dape or causal or routes" \
    > $out/tests.log 2>&1
timeout 300 python3 -m lenx.bench --methods sdpa,dapev2-kerple --backends sdpa,triton --lengths 8192,16384,32768 \
    --commit "$1" --out $out/bench_dape.json > $out/bench_dape.log 2>&1
tar czf $OUT/kernels.tar.gz $out
