"""Session 4: DAPE V2 (+ Kerple, k 3, D 32) forward variants, each checked against the dense fp32
reference at T = 1024 (out and gradients) and timed (fwd, fwd+bwd; bf16, B 1, H 12, d 64) at 8192.
Variants: the conv weights loaded once per program with the taps unrolled (PRELOAD_WEIGHTS), and
window tiles (BM, BNW, warps, stages) for both passes.
Usage (repository root on a CUDA machine): PYTHONPATH=src python3 results/bench/dape_fwd_variants.py OUT.json"""
import json
import sys

import torch

from lenx import bench
from lenx.ops.dape_v2 import triton as dt

VARIANTS = [
    {"preload": False, "tiles": (16, 32, 8, 1)},
    {"preload": True, "tiles": (16, 32, 8, 1)},
    {"preload": True, "tiles": (16, 16, 8, 1)},
    {"preload": True, "tiles": (32, 16, 8, 1)},
    {"preload": True, "tiles": (16, 32, 16, 1)},
]
dev = torch.device("cuda")
kw = dict(batch=1, heads=12, head_dim=64, dtype=torch.bfloat16, device=dev, chunk_size=256, dape_hidden=32,
          dape_kernel=3, warmup_ms=25, rep_ms=200, max_reps=20)
base_tiles = dt.TILES["k3"]
rows = []
r = bench._measure("sdpa", "sdpa", 8192, **kw)
rows.append({"variant": "sdpa", "fwd_ms": r["fwd_ms"], "fwdbwd_ms": r["fwdbwd_ms"]})
print(rows[-1], flush=True)
for var in VARIANTS:
    dt.PRELOAD_WEIGHTS = var["preload"]
    dt.TILES["k3"] = var["tiles"]
    row = {"variant": {"preload": var["preload"], "tiles": list(var["tiles"])}}
    try:
        row["check_err"] = bench._check_against_dense("dapev2-kerple", 1024, 12, 64, dev)
        r = bench._measure("dapev2-kerple", "triton", 8192, **kw)
        row.update({k: r[k] for k in ("fwd_ms", "fwdbwd_ms") if k in r})
    except Exception as err:  # noqa: BLE001  (a variant that does not compile or fit is a result)
        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    rows.append(row)
    print(row, flush=True)
    torch.cuda.empty_cache()
dt.PRELOAD_WEIGHTS = False
dt.TILES["k3"] = base_tiles
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(sys.argv[1], "w"), indent=1)
