#!/bin/bash
# Session 4: a whole 125m training step of dapev2-kerple per attention backend (dape_train_backends.py).
# Usage (repository root on the device): bash results/bench/device_session4j.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
timeout 500 python3 results/bench/dape_train_backends.py $out/dape_train_backends.json > $out/dape_train_backends.log 2>&1
tar czf $OUT/kernels.tar.gz $out
