#!/usr/bin/env bash
# On a one-GPU device: the CUDA test suite of the PyTorch backends, then the wall time of a full
# `lenx eval` (lengths 128..8192, 64 windows) of a `small` dapev2-kerple model with the chunked
# PyTorch path versus the fused Triton kernel (the planner's choice on CUDA).
# Usage (repository root, no install): OUT=/some/dir bash scripts/device_eval_speedup.sh
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/lenx_out}
mkdir -p "$OUT"
python3 -m pytest -q -m gpu tests/attention/test_gpu_backends.py 2>&1 | tail -15 | tee "$OUT/gpu_backends_tests.log"
run=/tmp/lenx_speedup_run
rm -rf "$run"
python3 -m lenx train -c small --no-progress -o "$run" \
  --set data.corpus=synthetic --set model.method=dapev2-kerple --set train.steps=50 --set train.ckpt_every=50 \
  > "$OUT/train.log" 2>&1 || { tail -20 "$OUT/train.log"; exit 1; }
python3 - "$run" "$OUT" <<'PY'
import json, sys, time, torch
from lenx.evaluation.evaluate import evaluate
run, out = sys.argv[1], sys.argv[2]
rows = {}
for backend in ("triton", "chunked"):  # warm-up: kernel compilation stays out of the timing
    evaluate(run, lengths=[256, 8192], windows=2, backend=backend, progress=False, write=False)
for backend in ("triton", "chunked"):
    torch.cuda.synchronize(); t = time.perf_counter()
    r = evaluate(run, backend=backend, progress=False, write=False)
    torch.cuda.synchronize()
    rows[backend] = {"seconds": time.perf_counter() - t, "backends": r["backends"], "lengths": r["lengths"],
                     "windows": r["windows"], "ppl_8192": r["results"]["8192"]["ppl"]}
    print(backend, rows[backend], flush=True)
rows["speedup"] = rows["chunked"]["seconds"] / rows["triton"]["seconds"]
rows["gpu"] = torch.cuda.get_device_name()
rows["torch"] = torch.__version__
import triton; rows["triton_version"] = triton.__version__
json.dump(rows, open(f"{out}/eval_speedup.json", "w"), indent=2)
print("speedup chunked/triton: %.2fx" % rows["speedup"])
PY
