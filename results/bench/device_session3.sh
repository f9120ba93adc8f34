#!/bin/bash
# Session 3's kernel call (one GPU; run detached beside the CHE jobs on the other GPUs): the GPU
# kernel tests, the benchmark with the tile sweep (one-pass bias backward, channels-first DAPE V2
# forward) and the probe, then Nsight Compute on both DAPE V2 forward kernels. Writes runs/kernels/.
# Usage (repository root on the device): CUDA_VISIBLE_DEVICES=3 bash results/bench/device_session3.sh COMMIT
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader > $out/gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" >> $out/gpu.txt
LENX_KERNEL_ERRORS=$out/errors.jsonl timeout 420 python3 -m pytest -q -n 8 -p no:cacheprovider \
    tests/test_triton_kernels.py > $out/tests.log 2>&1
timeout 600 python3 -m lenx.bench --probe --tile-sweep --sweep-methods kerple,dapev2-kerple \
    --methods sdpa,kerple,stickbreaking,dapev2-kerple --backends sdpa,triton --lengths 8192,16384,32768 \
    --commit "$1" --out $out/bench.json > $out/bench.log 2>&1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 300 $NCU --clock-control none --kernel-name regex:"_dape_fwd" --launch-skip 1 --launch-count 4 \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis \
    --section Occupancy --section MemoryWorkloadAnalysis python3 results/bench/profile_dape.py > $out/ncu_dape.txt 2>&1
touch $out/finished
