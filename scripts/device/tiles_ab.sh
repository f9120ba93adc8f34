#!/bin/bash
# Issue 45: the skewed DAPE V2 tiles before (conv_f and conv_dy 8, 16, 8, 3) and after (conv_f 16, 16,
# 8, 3; conv_dy 8, 16, 4, 3) on one device, in one call: the 125m training step of kerple against
# dapev2-kerple at 512 x 32 and 2048 x 8 (profiler GPU time, peak memory). The old tiles are set in
# process on lenx.ops.dape_v2.skewed.CONFIG before the bench runs.
# Usage (repository root on the device): COMMIT=<sha> OUT=/some/dir bash scripts/device/tiles_ab.sh
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
mkdir -p "$OUT/ab"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/ab/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/ab/gpu.txt"
for shape in 32x512 8x2048; do
    B=${shape%x*} T=${shape#*x}
    for tiles in old new; do
        timeout 90 python3 - "$tiles" --train-step --methods kerple,dapev2-kerple --batch "$B" --seq-len "$T" \
            --steps 6 --warmup 2 --profile-steps 2 --commit "$COMMIT" -o "$OUT/ab/T${T}_$tiles.json" <<'PY' 2>&1 \
            | grep -v -i warn | tail -8 | tee "$OUT/ab/T${T}_$tiles.log"
import sys
from lenx.ops.dape_v2 import skewed
if sys.argv[1] == "old":
    skewed.CONFIG.update(conv_f=(8, 16, 8, 3), conv_dy=(8, 16, 8, 3))
print("tiles", sys.argv[1], "conv_f", skewed.CONFIG["conv_f"], "conv_dy", skewed.CONFIG["conv_dy"])
from lenx.cli import main
sys.exit(main(["bench", *sys.argv[2:]]))
PY
    done
done
