#!/bin/bash
# Nsight Compute counters of every skewed DAPE V2 kernel (one layer fwd+bwd, twice: the first pass
# compiles) at 512 x 32 and 2048 x 8: tensor-pipe utilisation, issue slots, DRAM and L2 throughput,
# occupancy. Metrics this ncu does not know are dropped (listed in $OUT/ncu_metrics_missing.txt).
# Needs the copy scripts/tune/_variants/main.py (time_variants.py's docstring says how to make it).
# Usage (repository root on the device): OUT=/some/dir bash scripts/device/ncu_skewed.sh
export PYTHONPATH=$PWD/src:$PWD/scripts/tune PYTHONUNBUFFERED=1
mkdir -p "$OUT"
want="gpu__time_duration.sum sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
sm__inst_executed_pipe_tensor_op_hmma.sum sm__inst_executed_pipe_tensor_op_gmma.sum
sm__instruction_throughput.avg.pct_of_peak_sustained_active sm__throughput.avg.pct_of_peak_sustained_elapsed
dram__throughput.avg.pct_of_peak_sustained_elapsed dram__bytes.sum lts__throughput.avg.pct_of_peak_sustained_elapsed
l1tex__throughput.avg.pct_of_peak_sustained_active sm__warps_active.avg.pct_of_peak_sustained_active
launch__registers_per_thread launch__occupancy_limit_registers smsp__issue_active.avg.pct_of_peak_sustained_active"
ncu --query-metrics --chip gh100 > "$OUT/ncu_query.txt" 2>&1
have=""
for m in $want; do
    base=${m%%.*}
    if grep -q "^$base " "$OUT/ncu_query.txt" || grep -q "^$base\b" "$OUT/ncu_query.txt"; then have="$have,$m"; else echo "$m" >> "$OUT/ncu_metrics_missing.txt"; fi
done
have=${have#,}
args=(--metrics "$have"); [ -z "$have" ] && args=(--section SpeedOfLight --section Occupancy)
echo "metrics: $have" | tee "$OUT/ncu.log"
for shape in 32x512 8x2048; do
    timeout 240 ncu --clock-control none --kernel-name regex:"_conv|_attn|_scores|_to_slots|_dq|_dk" \
        "${args[@]}" --csv python3 scripts/tune/ncu_skewed.py main "$shape" > "$OUT/ncu_$shape.csv" 2>> "$OUT/ncu.log"
    echo "$shape rc=$? lines=$(wc -l < "$OUT/ncu_$shape.csv")" | tee -a "$OUT/ncu.log"
done
