#!/usr/bin/env bash
# Multi-GPU checks for lenx on a 2-GPU machine (nvidia-h200-x2), about 5 minutes:
#   1. loss curves of 1 GPU vs 2-GPU DDP vs 2-GPU FSDP2 (small preset, synthetic corpus, bf16) -> equivalence.json
#   2. tokens/s of the small and 125m presets on 1 and 2 GPUs, scaling efficiency          -> throughput.json
# plus env.json, summary.json and logs.txt (tails of failed runs) in $OUT.
#
#   OUT=/path/to/results bash scripts/device_distributed.sh                      # on the GPU machine
#   DEVICE=cpu PYTHON=.venv/bin/python OUT=/tmp/dd bash scripts/device_distributed.sh   # logic check on CPU (gloo)
#
# Run folders and full logs go to $WORK (default /tmp/lenx-distributed).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder for the results}"
# NVLink multicast stays off: on a shared multi-GPU host it can take the GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" scripts/device_distributed.py --out "$OUT" --device "${DEVICE:-cuda}" \
    --work "${WORK:-/tmp/lenx-distributed}"
