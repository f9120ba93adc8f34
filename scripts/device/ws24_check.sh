#!/bin/bash
# One device call for branch ws24 (chain_ws with one head partition): its GPU tests (JUnit), the
# chain / chain_ws timing at 8192 and 16384, and Nsight Compute's warp-state and scheduler sections
# of one launch of each kernel at 8192 (scripts/tune/ncu_chain_ws.py). Everything is packed into
# $OUT/ws24.tar.gz after each stage.
# Usage (repository root on the device): COMMIT=<sha> OUT=/some/dir bash scripts/device/ws24_check.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
W=$OUT/ws24
mkdir -p "$W"
pack() { (cd "$OUT" && tar czf ws24.tar.gz.part ws24 && mv ws24.tar.gz.part ws24.tar.gz); }
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee "$W/versions.txt"
timeout "${TESTS_S:-240}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_dape_v2_chain_ws.py \
    --junitxml="$W/junit.xml" 2>&1 | tail -30 > "$W/pytest.log"
pack
timeout 120 python3 scripts/tune/time_chain.py "$W/chain_ws_times.json" --lengths 8192,16384 --ws 2>&1 \
    | tail -20 > "$W/time_chain.log"
pack
sections=(--section WarpStateStats --section SchedulerStats --section InstructionStats --section LaunchStats
          --section Occupancy --section SpeedOfLight)
for kernel in "_dape_v2_chain_ws" "_dape_v2_chain$"; do
    name=$([ "$kernel" = "_dape_v2_chain_ws" ] && echo ws || echo chain)
    timeout 100 ncu --clock-control none --kernel-name regex:"$kernel" --launch-skip 1 --launch-count 1 \
        "${sections[@]}" --csv --page details python3 scripts/tune/ncu_chain_ws.py \
        > "$W/ncu_$name.csv" 2> "$W/ncu_$name.err"
    echo "$name rc=$? lines=$(wc -l < "$W/ncu_$name.csv")" >> "$W/ncu.log"
    pack
done
exit 0
