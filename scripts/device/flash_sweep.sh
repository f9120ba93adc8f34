#!/bin/bash
# The skewed DAPE V2 path's flash kernels (attn_fwd, attn_bwd, dq, dk) at other tile settings, one
# setting per process (an illegal address poisons the CUDA context of every later launch), the other
# kernels at their defaults: GPU kernel time of the kernel swept (scripts/tune/time_skewed.py sweep).
# The settings compile for sm_90a without spills (scripts/tune/compile_skewed.py --tiles, triton 3.6),
# except where noted in notes/kernels.md. Defaults: CONFIG's first, so each run has its own baseline.
# Usage (repository root on the device): OUT=/some/dir [SHAPES="32x512 8x2048"] [SETTINGS="..."] \
#     bash scripts/device/flash_sweep.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p "$OUT/flash_sweep"
SETTINGS=${SETTINGS:-"attn_fwd:64,32,4,2 attn_fwd:64,32,4,3 attn_fwd:128,32,8,2 attn_fwd:128,64,8,2 attn_fwd:64,64,8,2
    attn_bwd:64,64,4,2 attn_bwd:64,64,4,3 attn_bwd:64,32,4,2 dq:64,64,4,2 dq:64,32,4,3 dq:128,64,8,2
    dk:64,64,4,2 dk:64,32,4,3 dk:128,64,8,2"}
for shape in ${SHAPES:-32x512 8x2048}; do
    for setting in $SETTINGS; do
        kernel=${setting%%:*} tiles=${setting#*:}
        timeout 60 python3 scripts/tune/time_skewed.py "$OUT/flash_sweep/${shape}_${kernel}_${tiles//,/_}.json" \
            "$shape" sweep "$kernel" "$tiles" 2>&1 | grep "^sweep" | sed "s/^/$shape /" | tee -a "$OUT/flash_sweep.log"
    done
done
