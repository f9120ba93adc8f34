#!/bin/bash
# Session 4: per-kernel GPU times of DAPE V2 and Kerple forward+backward (results/bench/kernel_times.py).
# Usage (repository root on the device): bash results/bench/device_session4k.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
timeout 300 python3 results/bench/kernel_times.py $out/kernel_times.json > $out/kernel_times.log 2>&1
tar czf $OUT/kernels.tar.gz $out
