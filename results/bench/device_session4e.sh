#!/bin/bash
# Session 4: DAPE V2 forward variants (results/bench/dape_fwd_variants.py) after the DAPE V2 GPU
# tests. Usage (repository root on the device): bash results/bench/device_session4e.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_triton_kernels.py -k "dape" > $out/tests.log 2>&1
timeout 380 python3 results/bench/dape_fwd_variants.py $out/dape_fwd_variants.json > $out/dape_fwd_variants.log 2>&1
tar czf $OUT/kernels.tar.gz $out
