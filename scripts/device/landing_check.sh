#!/bin/bash
# One device call for what landed since the last GPU run, each stage under its own `timeout`:
#  1. the gpu-marked tests of tests/ops, tests/attention and tests/model (JUnit, summary with the
#     kernel-source hash, for results/gpu-tests/);
#  2. the 125m training step (profiler GPU time, peak memory) at 512 x 32 (kerple, rope, dapev2-kerple,
#     fox), 2048 x 8, 4096 x 4 and 8192 x 1 (kerple, dapev2-kerple: issue 45's memory bars);
#  3. one layer at 8192 and 16384 (B 1, H 12, d 64): sdpa, kerple, dapev2-kerple, fox on the fused kernels;
#  4. one suite cell at 16384 (8 inputs) of a 125m model per method, where data/code is unpacked (it
#     is unpacked from .carry/code when that was carried);
#  5. sliding windows (W in $WINDOWS, default 512) at 8192 and 32768: the backends in $WINDOW_BACKENDS
#     (default sdpa,flex,chunked,triton), with --gpu-time $GPU_TIME where that is set;
#  6. EXTRA: more commands (one string, run by bash) with their own timeouts.
# STAGES picks some (default "tests step layer window cell extra"). Everything goes into
# $OUT/landing.tar.gz ($OUT returns a few files only), packed again after every stage so that a call
# cut short keeps what its finished stages wrote.
# Usage (repository root on the device): COMMIT=<sha> OUT=/some/dir bash scripts/device/landing_check.sh
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
W=$OUT/landing
mkdir -p "$W/gpu-tests" "$W/bench"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$W/gpu-tests/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee "$W/versions.txt"
quiet() { grep -v -i warn | tail -"$1"; }
STAGES=" ${STAGES:-tests step layer window cell extra} "
on() { [[ $STAGES == *" $1 "* ]]; }
pack() { (cd "$OUT" && tar czf landing.tar.gz.part landing && mv landing.tar.gz.part landing.tar.gz); }
[ -d .carry/code ] && [ ! -f data/code/manifest.json ] && python3 scripts/data/pack_corpus.py unpack .carry/code data/code

# SIGINT at the time limit: pytest then stops as on Ctrl-C, names its failures and writes the JUnit
# file of what ran (a SIGTERM left neither); the exit status (124 from timeout at the limit) goes into the summary
if on tests; then
    LENX_KERNEL_ERRORS=$W/gpu-tests/errors.jsonl timeout -s INT -k 30 "${TESTS_S:-200}" python3 -m pytest -q -n 12 \
        -m gpu -p no:cacheprovider --junitxml="$W/gpu-tests/junit.xml" tests/ops tests/attention tests/model \
        > "$W/gpu-tests/pytest.full.log" 2>&1
    rc=$?
    quiet 30 < "$W/gpu-tests/pytest.full.log" | tee "$W/gpu-tests/pytest.log"
    python3 scripts/device/gpu_summary.py "$W/gpu-tests/junit.xml" "$W/gpu-tests/summary.json" \
        "bash scripts/device/landing_check.sh (pytest -n 12 -m gpu tests/ops tests/attention tests/model)" "$rc"
fi
pack

step() {  # B T methods
    timeout "${STEP_S:-70}" python3 -m lenx bench --train-step --methods "$3" --batch "$1" --seq-len "$2" --steps 6 \
        --warmup 2 --profile-steps 2 --commit "$COMMIT" -o "$W/bench/train_step_T$2.json" 2>&1 | quiet 14 \
        | tee "$W/bench/train_step_T$2.log"
}
if on step; then
    step 32 512 kerple,rope,dapev2-kerple,fox
    step 8 2048 kerple,dapev2-kerple
    step 4 4096 kerple,dapev2-kerple
    step 1 8192 kerple,dapev2-kerple
    pack
fi

on layer && timeout "${LAYER_S:-90}" python3 -m lenx bench --methods sdpa,kerple,dapev2-kerple,fox --backends sdpa,triton \
    --lengths 8192,16384 --batch 1 --heads 12 --head-dim 64 --commit "$COMMIT" -o "$W/bench/layer.json" 2>&1 \
    | quiet 24 | tee "$W/bench/layer.log"

pack
on cell && [ -f data/code/manifest.json ] && timeout "${CELL_S:-90}" python3 scripts/tune/time_suite_cell.py \
    "$W/bench/suite_cell_16384.json" --methods kerple,rope,dapev2-kerple --length 16384 2>&1 | quiet 6 \
    | tee "$W/bench/suite_cell.log"

pack
for window in ${WINDOWS:-512}; do
    on window && timeout "${WINDOW_S:-60}" python3 -m lenx bench --methods sdpa,kerple,stickbreaking \
        --backends "${WINDOW_BACKENDS:-sdpa,flex,chunked,triton}" --window "$window" --lengths 8192,32768 \
        --batch 1 --heads 12 --head-dim 64 ${GPU_TIME:+--gpu-time "$GPU_TIME"} --commit "$COMMIT" \
        -o "$W/bench/window_$window.json" 2>&1 | quiet 24 \
        | tee "$W/bench/window_$window.log"
done
pack
on extra && [ -n "${EXTRA:-}" ] && bash -c "$EXTRA" 2>&1 | quiet 40 | tee "$W/extra.log"
pack && rm -rf "$W"
exit 0
