#!/bin/bash
# Session 4: bias-only tiles for d = 128 (results/bench/kerple_d128_tiles.py).
# Usage (repository root on the device): bash results/bench/device_session4l.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
timeout 400 python3 results/bench/kerple_d128_tiles.py $out/kerple_d128_tiles.json > $out/kerple_d128_tiles.log 2>&1
tar czf $OUT/kernels.tar.gz $out
