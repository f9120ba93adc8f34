#!/bin/bash
# One device call: the GPU kernel tests, then the benchmark (args passed through to lenx.bench),
# then (if DAPE_T is set) DAPE V2 and SDPA alone at those lengths into NAME_dape.json.
# Usage (repository root on the device): [DAPE_T=8192] bash results/bench/device_run.sh NAME [bench args...]
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
name=$1; shift
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee $OUT/${name}_gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" | tee -a $OUT/${name}_gpu.txt
LENX_KERNEL_ERRORS=$OUT/${name}_errors.jsonl timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_triton_kernels.py 2>&1 | tail -4 | tee $OUT/${name}_tests.log
timeout 300 python3 -m lenx.bench "$@" --out $OUT/${name}.json 2>&1 | grep -v "Warning\|warn" | tee $OUT/${name}_bench.log | tail -40
if [ -n "$DAPE_T" ]; then
  timeout 200 python3 -m lenx.bench --methods sdpa,dapev2-kerple --backends sdpa,triton --lengths $DAPE_T \
      --commit "$(echo "$@" | sed -n 's/.*--commit \([^ ]*\).*/\1/p')" --out $OUT/${name}_dape.json 2>&1 \
      | grep -v "Warning\|warn" | grep "T=" | tee -a $OUT/${name}_bench.log
fi
