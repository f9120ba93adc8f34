#!/bin/bash
# Session 4: the stick-breaking GPU tests (with the large-logit cases), then Nsight Compute on the
# stick-breaking forward and backward at T 8192 (results/bench/profile_kernels.py; stall reasons and
# pipe utilisation). Usage (repository root on the device): bash results/bench/device_session4f.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=runs/kernels
mkdir -p $out
LENX_KERNEL_ERRORS=$out/errors.jsonl timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider \
    tests/test_triton_kernels.py -k "stickbreaking" > $out/tests.log 2>&1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 300 $NCU --clock-control none --kernel-name regex:"_sb_fwd|_sb_bwd" --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
    --section ComputeWorkloadAnalysis --section Occupancy --section InstructionStats \
    python3 results/bench/profile_kernels.py > $out/ncu_sb.txt 2>&1
tar czf $OUT/kernels.tar.gz $out
