"""Session 4: bias-only (Kerple) tiles for head dim 128 (biased.CONFIG_WIDE), each checked against
the dense fp32 reference (T 1024, d 128) and timed fwd / fwd+bwd at 8192 and 16384 (bf16, B 1, H 12).
Usage (repository root on a CUDA machine): PYTHONPATH=src python3 results/bench/kerple_d128_tiles.py OUT.json"""
import json
import sys

import torch

from lenx import bench
from lenx.ops.dape_v2 import biased

CANDIDATES = [{}, {"dkdv": (64, 64, 8, 3)}, {"dkdv": (64, 64, 8, 2)}, {"dkdv": (32, 64, 4, 3)},
              {"dkdv": (32, 32, 4, 3)}, {"dq": (64, 32, 8, 3)}, {"dq": (128, 32, 8, 3)}, {"fwd": (64, 32, 4, 3)},
              {"fwd": (128, 64, 8, 3)}]
dev = torch.device("cuda")
kw = dict(batch=1, heads=12, head_dim=128, dtype=torch.bfloat16, device=dev, chunk_size=256, dape_hidden=32,
          dape_kernel=3, warmup_ms=25, rep_ms=200, max_reps=40)
rows = []
for T in (8192, 16384):
    r = bench._measure("sdpa", "sdpa", T, **kw)
    rows.append({"variant": "sdpa", "T": T, "fwd_ms": r["fwd_ms"], "fwdbwd_ms": r["fwdbwd_ms"]})
    print(rows[-1], flush=True)
for cand in CANDIDATES:
    biased.CONFIG_WIDE.clear()
    biased.CONFIG_WIDE.update(cand)
    row = {"variant": {k: list(v) for k, v in cand.items()}}
    try:
        row["check_err"] = bench._check_against_dense("kerple", 1024, 12, 128, dev)
        for T in (8192, 16384):
            r = bench._measure("kerple", "triton", T, **kw)
            row[f"fwd_ms_{T}"], row[f"fwdbwd_ms_{T}"] = r["fwd_ms"], r["fwdbwd_ms"]
    except Exception as err:  # noqa: BLE001  (a candidate that does not fit is a result)
        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    rows.append(row)
    print(row, flush=True)
biased.CONFIG_WIDE.clear()
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(sys.argv[1], "w"), indent=1)
