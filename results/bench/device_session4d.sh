#!/bin/bash
# Session 4: stick-breaking backward variants (transposed dK/dV products, 32-key tiles), timed at
# 8192 and 16384 by results/bench/sb_bwd_variants.py, after the stick-breaking GPU tests.
# Usage (repository root on the device): bash results/bench/device_session4d.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_triton_kernels.py -k "stickbreaking" \
    > $out/tests.log 2>&1
timeout 400 python3 results/bench/sb_bwd_variants.py $out/sb_bwd_variants.json > $out/sb_bwd_variants.log 2>&1
tar czf $OUT/kernels.tar.gz $out
