#!/bin/bash
# DAPE V2's skewed training kernels under a memory budget (LENX_DAPE_V2_MEMORY, in GiB; issue 45 part 3):
# the 125m step's GPU time and peak memory with Kerple in the same run, once per budget ("auto" is the
# device's free memory, which keeps every layer's buffers where they fit). Each run's JSON records
# the budget (settings.environment) and the kernel each layer ran (rows[].kernels).
# Usage (repository root on the device): COMMIT=<sha> OUT=/some/dir bash scripts/device/memory_plan.sh
# BUDGETS_512 / BUDGETS_2048: space-separated budgets (defaults below; empty: none); RUN_S: seconds per run.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
W=$OUT/memplan
mkdir -p "$W"
run() {  # B T budget
    LENX_DAPE_V2_MEMORY=$3 timeout "${RUN_S:-100}" python3 -m lenx bench --train-step --methods kerple,dapev2-kerple \
        --batch "$1" --seq-len "$2" --steps 6 --warmup 2 --profile-steps 2 --commit "$COMMIT" \
        -o "$W/train_step_T$2_$3.json" > "$W/train_step_T$2_$3.log" 2>&1
    echo "T $2 B $1 budget $3: rc $?"
}
for b in ${BUDGETS_512-auto 1.6 0.5}; do run 32 512 "$b"; done
for b in ${BUDGETS_2048-auto 6.5 2}; do run 8 2048 "$b"; done
(cd "$OUT" && tar czf memplan.tar.gz memplan && rm -rf memplan)
