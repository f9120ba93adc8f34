"""The DAPE V2 fused kernel of this checkout against an earlier version of it (a copy of its
triton.py, loaded as a sibling module), both against fused causal SDPA in the same run: bf16, B 1,
H 12, d 64, k 3, D 32, Kerple; forward and forward+backward medians and peak memory.

Usage (repository root, CUDA machine):
    git show <commit>:src/lenx/ops/dape_v2/triton.py > old_triton.py
    PYTHONPATH=src python3 scripts/tune/compare_dape.py --old old_triton.py --label <commit> -o out.json
"""

import argparse
import importlib.util
import json

import torch
from torch.nn import functional as F

from lenx.attention import DapeV2, KerpleLog
from lenx.bench.kernels import median_ms
from lenx.ops.dape_v2.triton import dape_v2_triton
from lenx.runinfo import environment


def load_old(path: str):
    spec = importlib.util.spec_from_file_location("lenx.ops.dape_v2._old_triton", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # relative imports resolve inside lenx.ops.dape_v2
    return mod.dape_v2_triton


def timed(fn, q, k, v, g):
    with torch.no_grad():
        fwd = median_ms(lambda: fn(q, k, v), 25, 200, 30)[0]
    both = median_ms(lambda: fn(q, k, v).backward(g), 25, 200, 30, (q, k, v))[0]
    torch.cuda.reset_peak_memory_stats()
    fn(q, k, v).backward(g)
    return {"fwd_ms": fwd, "fwd_bwd_ms": both, "peak_mb": torch.cuda.max_memory_allocated() / 2 ** 20}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="an earlier ops/dape_v2/triton.py")
    ap.add_argument("--label", required=True, help="what --old is (its commit)")
    ap.add_argument("--lengths", default="8192,16384")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda")
    H = 12
    kb = KerpleLog(H).to(dev)
    proc = DapeV2(H, 32, 3, with_bias=True).to(dev)
    old = load_old(a.old)
    rows = []

    def case(name, fn, T):
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, H, T, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        g = torch.randn_like(q)
        r = {"case": name, "T": T, **timed(fn, q, k, v, g)}
        rows.append(r)
        print(json.dumps(r), flush=True)

    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    for T in [int(x) for x in a.lengths.split(",")]:
        case("sdpa", sdpa, T)
        case("triton (this checkout)", lambda q, k, v: dape_v2_triton(q, k, v, *proc.conv_weights(), kb.table(T, dev)), T)
        case(f"triton {a.label}", lambda q, k, v: old(q, k, v, *proc.conv_weights(), kb.table(T, dev)), T)

    for r in rows:
        base = next(x for x in rows if x["case"] == "sdpa" and x["T"] == r["T"])
        r["fwd_x_sdpa"] = r["fwd_ms"] / base["fwd_ms"]
        r["fwd_bwd_x_sdpa"] = r["fwd_bwd_ms"] / base["fwd_bwd_ms"]
    with open(a.out, "w") as f:
        json.dump({"environment": environment(), "old": a.label, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
