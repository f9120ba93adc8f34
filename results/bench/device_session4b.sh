#!/bin/bash
# Session 4, calls 2-3 (one H200): stick-breaking GPU tests, the probe (atomics on/off), the
# stick-breaking sweep (grid order: heads outer; stages; tiles) and the benchmark.
# Usage (repository root on the device): bash results/bench/device_session4b.sh COMMIT
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader > $out/gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" >> $out/gpu.txt
timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_triton_kernels.py -k "stickbreaking or causal or routes" \
    > $out/tests.log 2>&1
timeout 60 python3 results/bench/sb_suffix_check.py > $out/suffix_check.log 2>&1
timeout 420 python3 -m lenx.bench --probe --tile-sweep --sweep-methods stickbreaking \
    --methods sdpa,stickbreaking --backends sdpa,triton --lengths 8192,16384 \
    --commit "$1" --out $out/bench.json > $out/bench.log 2>&1
tar czf $OUT/kernels.tar.gz $out
