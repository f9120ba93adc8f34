"""Session 5 experiment: the DAPE V2 forward with the conv shifts taken by recomputed score
products (lenx.ops.dape_v2.shifted) against the windowed forward (lenx.ops.dape_v2.triton) and
fused SDPA, one run, T = 8192 and 16384, B = 1, H = 12, d = 64, bf16, Kerple bias, D = 32, k = 3.
Also the stick-breaking probe at 16384 (backward with and without its dK/dV atomic adds).
Usage: PYTHONPATH=src python results/bench/dape_fwd_shifted.py OUT.json COMMIT"""
import json
import sys

import torch
import triton
import torch.nn.functional as F

from lenx.attention import DapeV2, KerpleLog
from lenx.ops.dape_v2 import triton as dm
from lenx.ops.dape_v2.shifted import dape_v2_forward_shifted


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = []
    for _ in range(3):
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        torch.cuda.synchronize()
        best.append(a.elapsed_time(b) / reps)
    return sorted(best)[1]


res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
       "commit": sys.argv[2], "rows": []}
torch.manual_seed(0)
H, d = 12, 64
proc = DapeV2(H, 32, 3, with_bias=True).cuda()
for T in (8192, 16384):
    q, k, v = (torch.randn(1, H, T, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    tab = KerpleLog(H).cuda().table(T, "cuda").detach()
    with torch.no_grad():
        ref = dm.dape_v2_triton(q, k, v, proc, tab)
        sdpa = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        win = timed(lambda: dm.dape_v2_triton(q, k, v, proc, tab), reps=5)
        res["rows"].append({"T": T, "variant": "sdpa", "fwd_ms": sdpa})
        res["rows"].append({"T": T, "variant": "windowed (current)", "fwd_ms": win, "x_sdpa": win / sdpa})
        print(T, "sdpa", sdpa, "windowed", win, win / sdpa, flush=True)
        for cfg in [(16, 16, 8, 1), (16, 32, 8, 1), (16, 16, 4, 1), (32, 16, 8, 1), (16, 16, 8, 2)]:
            row = {"T": T, "variant": "shifted", "tiles": cfg}
            try:
                out, lse = dape_v2_forward_shifted(q, k, v, proc, tab, *cfg)
                row["max_abs_diff_vs_windowed"] = float((out.float() - ref.float()).abs().max())
                row["fwd_ms"] = timed(lambda: dape_v2_forward_shifted(q, k, v, proc, tab, *cfg), reps=5)
                row["x_sdpa"] = row["fwd_ms"] / sdpa
            except Exception as err:  # noqa: BLE001
                row["error"] = f"{type(err).__name__}: {str(err)[:200]}"
            print(row, flush=True)
            res["rows"].append(row)
            torch.cuda.empty_cache()
try:
    from lenx.bench import probe_table_grad
    res["probe_16384"] = probe_table_grad(T=16384, log=print)
except Exception as err:  # noqa: BLE001
    res["probe_error"] = f"{type(err).__name__}: {str(err)[:300]}"
json.dump(res, open(sys.argv[1], "w"), indent=1)
