#!/bin/bash
# Session 4, call 1 (one H200): the stick-breaking kernels with the hardware log2 (lg2.approx) and
# the shorter backward: the stick-breaking GPU tests, then its tile sweep and the benchmark
# (plus the DAPE V2 16 x 16 window re-measured with heavy-first launch order).
# Usage (repository root on the device): bash results/bench/device_session4.sh COMMIT
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader > $out/gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" >> $out/gpu.txt
timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_triton_kernels.py -k "stickbreaking or causal or routes" \
    > $out/tests.log 2>&1
timeout 420 python3 -m lenx.bench --tile-sweep --sweep-methods stickbreaking,dapev2-kerple \
    --methods sdpa,stickbreaking --backends sdpa,triton --lengths 8192,16384,32768 \
    --commit "$1" --out $out/bench.json > $out/bench.log 2>&1
tar czf $OUT/kernels.tar.gz $out
