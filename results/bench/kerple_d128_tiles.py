"""Session 4: bias-only (Kerple) tiles for head dim 128 (biased.CONFIG_WIDE), each checked against
the dense fp32 reference (T 1024, d 128) and timed fwd / fwd+bwd at 8192 and 16384 (bf16, B 1, H 12).
Usage (repository root on a CUDA machine): PYTHONPATH=src python3 results/bench/kerple_d128_tiles.py OUT.json"""
import json
import sys

import torch

from lenx import bench
from lenx.ops.dape_v2 import biased

# each candidate changes CONFIG_WIDE as committed (the session-4 choice); {} is that choice itself.
# The first run (commit 80a30db, CONFIG_WIDE empty then) tried dkdv 64x64x8x3/2, 32x64x4x3, 32x32x4x3,
# dq 64x32x8x3, 128x32x8x3, fwd 64x32x4x3, 128x64x8x3 (h200_session4_kerple_d128_tiles.json).
CANDIDATES = [{}, {"dq": (32, 32, 4, 3)}, {"dq": (64, 16, 4, 3)}, {"dkdv": (32, 64, 4, 4)}, {"dkdv": (16, 64, 4, 3)},
              {"dkdv": (32, 64, 8, 3)}]
dev = torch.device("cuda")
kw = dict(batch=1, heads=12, head_dim=128, dtype=torch.bfloat16, device=dev, chunk_size=256, dape_hidden=32,
          dape_kernel=3, warmup_ms=25, rep_ms=200, max_reps=40)
rows = []
for T in (8192, 16384):
    r = bench._measure("sdpa", "sdpa", T, **kw)
    rows.append({"variant": "sdpa", "T": T, "fwd_ms": r["fwd_ms"], "fwdbwd_ms": r["fwdbwd_ms"]})
    print(rows[-1], flush=True)
base = dict(biased.CONFIG_WIDE)
for cand in CANDIDATES:
    biased.CONFIG_WIDE.clear()
    biased.CONFIG_WIDE.update(base)
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
biased.CONFIG_WIDE.update(base)
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(sys.argv[1], "w"), indent=1)
