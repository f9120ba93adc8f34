#!/bin/bash
# Session 4: stick-breaking backward tiles with fewer registers (64 x 16 x 4 warps: 166-168
# registers, 3 CTAs per SM offline) in lenx.bench's tile sweep, and the benchmark after it.
# Usage (repository root on the device): bash results/bench/device_session4h.sh COMMIT
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
timeout 420 python3 -m lenx.bench --tile-sweep --sweep-methods stickbreaking --methods sdpa,stickbreaking \
    --backends sdpa,triton --lengths 8192,16384 --commit "$1" --out $out/bench_sb.json > $out/bench_sb.log 2>&1
tar czf $OUT/kernels.tar.gz $out
