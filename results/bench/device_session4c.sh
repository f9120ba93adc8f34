#!/bin/bash
# Session 4, last kernel call (one H200): the whole GPU test suite of the fused kernels, the
# stick-breaking suffix accuracy check, then the benchmark of every fused kernel against SDPA
# (d = 64 at 8192/16384/32768; d = 128 for Kerple and stick-breaking at 8192/16384).
# Usage (repository root on the device): bash results/bench/device_session4c.sh COMMIT
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader > $out/gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" >> $out/gpu.txt
LENX_KERNEL_ERRORS=$out/errors.jsonl timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider \
    tests/test_triton_kernels.py > $out/tests.log 2>&1
timeout 60 python3 results/bench/sb_suffix_check.py > $out/suffix_check.log 2>&1
timeout 330 python3 -m lenx.bench --methods sdpa,kerple,stickbreaking,dapev2-kerple --backends sdpa,triton \
    --lengths 8192,16384,32768 --commit "$1" --out $out/bench_d64.json > $out/bench_d64.log 2>&1
timeout 120 python3 -m lenx.bench --methods sdpa,kerple,stickbreaking --backends sdpa,triton --head-dim 128 \
    --lengths 8192,16384 --commit "$1" --out $out/bench_d128.json > $out/bench_d128.log 2>&1
tar czf $OUT/kernels.tar.gz $out
