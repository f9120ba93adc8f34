#!/bin/bash
# Session 3's last kernel call (one H200): the bias-only GPU tests (the carried table gradient),
# then the benchmark with the probe and the Kerple tile sweep. Writes $OUT/kernels.tar.gz.
# Usage (repository root on the device): bash results/bench/device_session3b.sh COMMIT
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader > $out/gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" >> $out/gpu.txt
LENX_KERNEL_ERRORS=$out/errors.jsonl timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider \
    tests/test_triton_kernels.py -k "biased or causal or routes" > $out/tests.log 2>&1
timeout 420 python3 -m lenx.bench --probe --tile-sweep --sweep-methods kerple \
    --methods sdpa,kerple,stickbreaking,dapev2-kerple --backends sdpa,triton --lengths 8192,16384,32768 \
    --commit "$1" --out $out/bench.json > $out/bench.log 2>&1
tar czf $OUT/kernels.tar.gz $out
