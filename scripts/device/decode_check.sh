#!/bin/bash
# Issue 32 part 4 on one GPU: the decoding GPU tests (the CUDA graph's and the compiled step's tokens
# against the eager step's, `lenx bench --decode` on a tiny model), then `lenx bench --decode` of the
# 125m preset: rope, kerple, dapev2-kerple, stickbreaking at 1024, 8192, 32768 x batch 1, 8, eager and
# graph, beside transformers' GPT-2 (eager, and static cache + torch.compile) in the same run.
# Usage (repository root on the device, no install): COMMIT=<sha> OUT=/some/dir [TESTS=0|BENCH=0] bash scripts/device/decode_check.sh
# (BENCH=0: the tests only; TESTS=0: the benchmark only, up to 9 minutes: GPT-2 compiles once per context
# and batch). Compare with the eager figures of the same run, not with other machines.
# MODES, CONTEXTS, BATCHES: lenx bench --decode's --modes, --contexts, --batches (e.g. MODES=eager,graph,compile
# CONTEXTS=8192 BATCHES=1: the compiled step compiles once per method, context and batch, ~30-60 s each).
# PROFILE=1: then one step of RoPE and Kerple at 8192 under the profiler in PROFILE_MODES (default
# eager,static,compile) and GPT-2's compiled step (scripts/device/decode_profile.py: wall against the
# kernels' sum, the top kernels and host ops).
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
[ "${TESTS:-1}" = 1 ] && timeout 540 python3 -m pytest -q -p no:cacheprovider -m gpu --junitxml="$OUT/decode-tests.xml" \
    tests/model/test_gpu_decoding.py tests/bench/test_decode_bench.py tests/export/test_hf_model.py 2>&1 | tail -15 | tee "$OUT/decode-tests.log"
[ "${BENCH:-1}" = 1 ] && timeout 540 python3 -m lenx bench --decode --commit "$COMMIT" -o "$OUT/bench_decode.json" \
    ${MODES:+--modes "$MODES"} ${CONTEXTS:+--contexts "$CONTEXTS"} ${BATCHES:+--batches "$BATCHES"} \
    2>&1 | grep -v -i "warn" | tail -60 | tee "$OUT/bench_decode.log"
[ "${PROFILE:-0}" = 1 ] && timeout 300 python3 scripts/device/decode_profile.py --methods rope,kerple --context 8192 \
    --modes "${PROFILE_MODES:-eager,static,compile}" --gpt2 compile \
    -o "$OUT/decode_profile.json" 2>&1 | grep -v -i "warn" | tail -40 | tee "$OUT/decode_profile.log"
