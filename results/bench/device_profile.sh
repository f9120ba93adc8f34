#!/bin/bash
# Nsight Compute on the fused kernels' second launches (results/bench/profile_kernels.py).
export PYTHONPATH=src PYTHONUNBUFFERED=1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 200 $NCU --clock-control none --kernel-name regex:"_bias_fwd|_bias_bwd_dq|_bias_bwd_dkdv|_sb_fwd|_sb_bwd" \
    --launch-skip 5 --launch-count 5 --section SpeedOfLight --section WarpStateStats --section LaunchStats \
    --section ComputeWorkloadAnalysis --section Occupancy python3 results/bench/profile_kernels.py > $OUT/ncu.txt 2>&1
grep -E "^  _|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Stall|Issue Slots Busy|No Eligible|Executed Ipc A|L1/TEX Hit|L2 Hit|Local Memory Spill" $OUT/ncu.txt | head -120
