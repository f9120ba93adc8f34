#!/bin/bash
# Session 5, call 1: the shifted-scores DAPE V2 forward against the windowed one and SDPA, and the
# stick-breaking probe at 16384. Usage (repository root on the device): bash results/bench/device_session5a.sh COMMIT
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
timeout 500 python3 results/bench/dape_fwd_shifted.py $out/dape_fwd_shifted.json "$1" > $out/dape_fwd_shifted.log 2>&1
tar czf $OUT/kernels.tar.gz $out
tail -40 $out/dape_fwd_shifted.log
