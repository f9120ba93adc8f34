"""Session 4: stick-breaking backward variants, each checked against the dense fp32 reference at
T = 1024 and timed (fwd and fwd+bwd, bf16, B 1, H 12, d 64) against SDPA at 8192 and 16384.
Usage (repository root on a CUDA machine): PYTHONPATH=src python3 results/bench/sb_bwd_variants.py OUT.json"""
import json
import sys

import torch

from lenx import bench
from lenx.ops.stickbreaking import triton as sb

VARIANTS = [
    {},
    {"dkv": ("dh_rows",)},
    {"dkv": ("dh_rows",), "bwd": (128, 32, 8, 3)},
    {"dkv": ("dh_rows",), "bwd": (128, 32, 8, 4)},
    {"dkv": ("dh_rows",), "bwd": (128, 32, 4, 3)},
    {"bwd": (128, 32, 8, 3)},
]
dev = torch.device("cuda")
base = dict(sb.CONFIG)
kw = dict(batch=1, heads=12, head_dim=64, dtype=torch.bfloat16, device=dev, chunk_size=256, dape_hidden=32,
          dape_kernel=3, warmup_ms=25, rep_ms=200, max_reps=40)
rows = []
for T in (8192, 16384):
    r = bench._measure("sdpa", "sdpa", T, **kw)
    rows.append({"variant": "sdpa", "T": T, "fwd_ms": r["fwd_ms"], "fwdbwd_ms": r["fwdbwd_ms"]})
    print(rows[-1], flush=True)
for var in VARIANTS:
    sb.CONFIG.clear()
    sb.CONFIG.update(base)
    sb.CONFIG.update(var)
    row = {"variant": {k: list(v) for k, v in var.items()}}
    try:
        row["check_err"] = bench._check_against_dense("stickbreaking", 1024, 12, 64, dev)
        for T in (8192, 16384):
            r = bench._measure("stickbreaking", "triton", T, **kw)
            row[f"fwd_ms_{T}"] = r["fwd_ms"]
            row[f"fwdbwd_ms_{T}"] = r["fwdbwd_ms"]
    except Exception as err:  # noqa: BLE001  (a variant that does not compile or fit is a result)
        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    rows.append(row)
    print(row, flush=True)
sb.CONFIG.clear()
sb.CONFIG.update(base)
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(sys.argv[1], "w"), indent=1)
