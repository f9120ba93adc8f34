#!/bin/bash
# One device call after the GPU suite (gpu_check.sh or skewed_check.sh, same commit): the skewed DAPE V2
# kernels per layer at the training shapes, the 125m training step of each method (`lenx bench
# --train-step`, GPU kernel time from the profiler) at the issue-28 shapes, and optional tile settings
# of one kernel at a time (decoding: scripts/device/decode_check.sh).
# Usage (repository root on the device): COMMIT=<sha> OUT=/some/dir [TILES="attn_fwd:64,64,4,2 ..."]
#   bash scripts/device/step_times.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
mkdir -p "$OUT"
METHODS=${METHODS:-sdpa,kerple,dapev2-kerple,stickbreaking,dapev2-stickbreaking}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 120 python3 scripts/tune/time_skewed.py "$OUT/layer_times.json" 2>&1 | grep -v -i warn | tee "$OUT/layer_times.log"
for shape in 32x512 8x2048 256x128; do
    B=${shape%x*} T=${shape#*x}
    timeout 150 python3 -m lenx bench --train-step --methods "$METHODS" --batch "$B" --seq-len "$T" --steps 10 \
        --warmup 3 --profile-steps 3 --commit "$COMMIT" -o "$OUT/train_step_T$T.json" 2>&1 | grep -v -i warn \
        | tail -15 | tee "$OUT/train_step_T$T.log"
done
for t in $TILES; do  # one process per setting: a bad address poisons the CUDA context
    timeout 60 python3 scripts/tune/time_skewed.py "$OUT/tiles_${t//[:,]/_}.json" 32x512 sweep "${t%%:*}" "${t#*:}" \
        2>&1 | grep -v -i warn | tail -3 | tee -a "$OUT/tiles.log"
done
