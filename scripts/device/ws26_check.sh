#!/bin/bash
# One device call for chain_ws's shared-memory changes (notes/kernels.md, "Issue 45 step 6"): its GPU
# tests (JUnit), the chain / chain_ws timing at 8192 and 16384, then Nsight Compute on one launch of
# chain_ws at 8192 with the memory sections, the per-instruction source counters and the shared-memory
# wavefront / bank-conflict metrics (the report itself comes back: its source page maps conflicts to
# SASS addresses, which scripts/tune/ws_sass_regions.py places in the partitions), the breakdown of
# its L1 throughput, and chain.py's metrics for comparison if time is left. Each stage has its own
# limit and is skipped when it could not finish inside ~580 s; everything is packed into
# $OUT/ws26.tar.gz after each stage.
# Usage (repository root on the device): COMMIT=<sha> OUT=/some/dir bash scripts/device/ws26_check.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
W=$OUT/ws26
mkdir -p "$W"
pack() { (cd "$OUT" && tar czf ws26.tar.gz.part ws26 && mv ws26.tar.gz.part ws26.tar.gz); }
fits() { [ $((SECONDS + $1)) -le 580 ] || { echo "skipped: $2 (at ${SECONDS} s)" >> "$W/skipped.log"; false; }; }
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee "$W/versions.txt"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv >> "$W/versions.txt" 2>&1

T_TESTS=${TESTS_S:-250}
timeout "$T_TESTS" python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_dape_v2_chain_ws.py \
    --junitxml="$W/junit.xml" 2>&1 | tail -30 > "$W/pytest.log"
pack
fits 100 time_chain && timeout 100 python3 scripts/tune/time_chain.py "$W/chain_ws_times.json" \
    --lengths 8192,16384 --ws 2>&1 | tail -20 > "$W/time_chain.log"
pack

# metrics this ncu knows (a name it does not know would fail the whole profile)
ncu --query-metrics 2>/dev/null | awk '{print $1}' > "$W/ncu_metric_names.txt"
want="l1tex__data_pipe_lsu_wavefronts_mem_shared.sum l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
l1tex__data_pipe_lsu_wavefronts.sum l1tex__data_bank_reads.sum l1tex__data_bank_writes.sum
smsp__inst_executed_op_shared_ld.sum smsp__inst_executed_op_shared_st.sum smsp__inst_executed_op_ldsm.sum
smsp__inst_executed_op_stsm.sum smsp__inst_executed_op_ldgsts.sum smsp__inst_executed.sum
l1tex__throughput.avg.pct_of_peak_sustained_elapsed sm__cycles_elapsed.avg"
metrics=$(for m in $want; do grep -qx "${m%%.*}" "$W/ncu_metric_names.txt" && echo -n "$m,"; done)
metrics=${metrics%,}
echo "metrics: $metrics" > "$W/ncu.log"
sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables
          --section WarpStateStats --section SchedulerStats --section InstructionStats --section LaunchStats
          --section Occupancy --section SourceCounters)
ncu_one() {   # name, kernel regex, limit, ncu options...
    local name=$1 regex=$2 limit=$3; shift 3
    timeout "$limit" ncu --clock-control none --kernel-name regex:"$regex" --launch-skip 1 --launch-count 1 \
        "$@" python3 scripts/tune/ncu_chain_ws.py > "$W/ncu_$name.out" 2> "$W/ncu_$name.err"
    echo "$name rc=$? (at ${SECONDS} s)" >> "$W/ncu.log"
}
if fits 140 "ncu chain_ws"; then
    ncu_one ws "_dape_v2_chain_ws" 140 "${sections[@]}" ${metrics:+--metrics "$metrics"} -f -o "$W/ncu_ws"
    ncu --import "$W/ncu_ws.ncu-rep" --page details --csv > "$W/ncu_ws_details.csv" 2>> "$W/ncu.log"
    ncu --import "$W/ncu_ws.ncu-rep" --page raw --csv > "$W/ncu_ws_raw.csv" 2>> "$W/ncu.log"
    ncu --import "$W/ncu_ws.ncu-rep" --page source --print-source sass --csv > "$W/ncu_ws_source.csv" 2>> "$W/ncu.log"
    # a call returns files of at most 16 MiB: the report stays behind if it would not fit in the tar
    [ "$(stat -c %s "$W/ncu_ws.ncu-rep" 2>/dev/null || echo 0)" -gt 12000000 ] && mv "$W/ncu_ws.ncu-rep" "$OUT/"
    pack
fi
# which L1 sub-unit sets the 70.7 % (data pipe wavefronts, bank reads / writes, tags, ...)
fits 60 "ncu breakdown" && ncu_one ws_breakdown "_dape_v2_chain_ws" 60 \
    --metrics "breakdown:l1tex__throughput.avg.pct_of_peak_sustained_elapsed" --csv --page raw
pack
fits 70 "ncu chain.py" && ncu_one chain "_dape_v2_chain$" 70 --section SpeedOfLight \
    ${metrics:+--metrics "$metrics"} --csv --page raw
pack
exit 0
