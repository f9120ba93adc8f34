#!/bin/bash
# Document-masked packing, measured (about 90 s on one H200; each stage under its own `timeout`,
# each JSON rewritten after every row or length, so a stage cut short keeps what it measured):
#  1. the 125m training step at T 2048 B 8, each method unmasked and with every window packed from
#     8 documents (document ids, positions restarting per document): rope (sdpa's boolean mask),
#     kerple and stickbreaking (their fused kernels take the ids and skip earlier documents' tiles);
#     the bar of issue 46 item 5: the packed step's GPU time within 1.1x (step_gpu_x_unmasked);
#  2. one layer (B 1, H 12, d 64) of plain softmax (what rope and nope run; method sdpa) with 8
#     documents and a window of 512, then 4096 keys, at 8192 and 32768 on the sdpa, flex, chunked and
#     triton backends: whether the planner's order (sdpa's dense [B, T, T] mask first) should change
#     for masked softmax.
# Everything goes into $OUT/documents.tar.gz, packed again after every stage.
# Usage (repository root on the device): COMMIT=<sha> OUT=/some/dir bash scripts/device/documents_bench.sh
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
W=$OUT/documents
mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$W/gpu.txt"
quiet() { grep -v -i warn | tail -"$1"; }
pack() { (cd "$OUT" && tar czf documents.tar.gz.part documents && mv documents.tar.gz.part documents.tar.gz); }

timeout "${STEP_S:-44}" python3 -m lenx bench --train-step --methods rope,kerple,stickbreaking --documents 8 \
    --batch 8 --seq-len 2048 --steps 4 --warmup 2 --profile-steps 2 --commit "$COMMIT" \
    -o "$W/train_step_docs8_T2048.json" 2>&1 | quiet 14 | tee "$W/train_step.log"
pack

for window in 512 4096; do
    timeout "${LAYER_S:-20}" python3 -m lenx bench --methods sdpa --backends sdpa,flex,chunked,triton --documents 8 \
        --window "$window" --lengths 8192,32768 --batch 1 --heads 12 --head-dim 64 --commit "$COMMIT" \
        -o "$W/layer_docs8_w$window.json" 2>&1 | quiet 16 | tee "$W/layer_w$window.log"
    pack
done
rm -rf "$W"
exit 0
