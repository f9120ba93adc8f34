#!/bin/bash
# Tile settings of the skewed DAPE V2 kernels, one setting per process (an illegal address poisons
# the CUDA context of every later launch in the same process), the other kernels at their defaults:
# GPU kernel time of the kernel swept (scripts/tune/time_skewed.py sweep). KERNELS picks a list:
# conv (the default: the conv kernels at B 32, T 512) or flash (attn_fwd, attn_bwd, dq, dk; CONFIG's
# own setting first in each, as the run's baseline; every setting listed compiles for sm_90a without
# spills on triton 3.6: scripts/tune/compile_skewed.py --tiles). SHAPES: BxT, default 32x512.
# Usage (repository root on the device): OUT=/some/dir [KERNELS=flash] [SHAPES="32x512 8x2048"] \
#     bash scripts/device/skewed_sweep.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p "$OUT/sweep"
case ${KERNELS:-conv} in
    conv) SETTINGS="conv_dy:8,16,8,1 conv_dy:4,16,4,1 conv_dy:8,16,4,1 conv_dy:16,16,8,1 conv_dy:4,32,8,1
        conv_dy:8,32,8,1 conv_dy:2,32,4,1 conv_dy:8,32,4,1 conv_dy:16,32,8,1 conv_z:16,16,8,1 conv_z:8,32,8,1
        conv_f:16,16,8,1 conv_f:8,32,8,1 conv_dx:16,16,8,1 conv_dx:8,32,8,1" ;;
    flash) SETTINGS="attn_fwd:64,32,4,2 attn_fwd:64,32,4,3 attn_fwd:128,32,8,2 attn_fwd:128,64,8,2
        attn_fwd:64,64,8,2 attn_bwd:64,64,4,2 attn_bwd:64,64,4,3 dq:64,64,4,2 dq:64,32,4,3
        dq:128,64,8,2 dk:64,64,4,2 dk:64,32,4,3 dk:128,64,8,2" ;;
    *) echo "error: KERNELS is conv or flash, got '$KERNELS'" >&2; exit 2 ;;
esac
for shape in ${SHAPES:-32x512}; do
    for setting in $SETTINGS; do
        kernel=${setting%%:*} tiles=${setting#*:}
        timeout 60 python3 scripts/tune/time_skewed.py "$OUT/sweep/${shape}_${kernel}_${tiles//,/_}.json" "$shape" \
            sweep "$kernel" "$tiles" 2>&1 | grep "^sweep" | sed "s/^/$shape /" | tee -a "$OUT/sweep.log"
    done
done
