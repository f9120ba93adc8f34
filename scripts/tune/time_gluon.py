"""The Gluon DAPE V2 forward against the Triton kernel's forward and fused causal SDPA in one run: bf16,
B 1, H 12, d 64, D 32, Kerple, no autograd graph; back-to-back medians (lenx.bench.kernels.median_ms), the Gluon
forward with its host-side tables and without them (built once, outside the timing: "gluon kernel"),
and peak memory per call. --d128: also DAPE V2 at head dim 128 (the Gluon forward takes 64 only; the
Triton kernel's shared memory takes heads x d <= 1024, so lenx routes d 128 at 12 heads to the chunked
backend) against SDPA at d 128.

Usage (repository root, sm_90 GPU, triton 3.6):
    PYTHONPATH=src python3 scripts/tune/time_gluon.py --lengths 8192,16384,32768 -o gluon_times.json
"""

import argparse
import json
import sys

import torch
from torch.nn import functional as F

from lenx.attention import DapeV2, KerpleLog, Softmax
from lenx.attention.backends import Parts, run_backend
from lenx.bench.kernels import median_ms
from lenx.ops.dape_v2 import gluon as G
from lenx.ops.dape_v2.triton import dape_v2_triton
from lenx.runinfo import environment


def peak_mb(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2 ** 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="8192,16384")
    ap.add_argument("--ks", default="3", help="conv kernel sizes, comma-separated")
    ap.add_argument("--d128", action="store_true", help="also head dim 128 (chunked backend) against SDPA")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda")
    H, dh, D = 12, 64, 32
    kb = KerpleLog(H).to(dev)
    rows = []
    for ks in [int(x) for x in a.ks.split(",")]:
        proc = DapeV2(H, D, ks, with_bias=True).to(dev)
        w = [x.detach() for x in proc.conv_weights()]
        for T in [int(x) for x in a.lengths.split(",")]:
            torch.manual_seed(0)
            q, k, v = (torch.randn(1, H, T, dh, device=dev, dtype=torch.bfloat16) for _ in range(3))
            tab = kb.table(T, dev).detach()
            operands = G.prepare(*w, tab, T, H, dev)

            def gluon_kernel():  # dape_v2_gluon_forward with its host tables built once, outside the timing
                real, G.prepare = G.prepare, lambda *args: operands
                try:
                    return G.dape_v2_gluon_forward(q, k, v, *w, tab)
                finally:
                    G.prepare = real

            cases = {
                "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                "triton fwd": lambda: dape_v2_triton(q, k, v, *w, tab),
                "gluon fwd (with tables)": lambda: G.dape_v2_gluon_forward(q, k, v, *w, tab),
                "gluon kernel": gluon_kernel,
            }
            if ks not in (1, 3):
                cases.pop("gluon fwd (with tables)"), cases.pop("gluon kernel")
            if a.d128:
                q8, k8, v8 = (torch.randn(1, H, T, 128, device=dev, dtype=torch.bfloat16) for _ in range(3))
                parts = Parts(kb, proc, Softmax())
                cases["sdpa d128"] = lambda: F.scaled_dot_product_attention(q8, k8, v8, is_causal=True)

                def chunked_d128():  # as the model runs it: under bf16 autocast (fp32 conv weights)
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        return run_backend("chunked", q8, k8, v8, parts)

                cases["chunked d128"] = chunked_d128
            for name, fn in cases.items():
                with torch.no_grad():
                    try:
                        ms = median_ms(fn, 25, 200, 30)[0]
                        mb = peak_mb(fn)
                    except torch.OutOfMemoryError:
                        ms = mb = None
                r = {"case": name, "k": ks, "T": T, "fwd_ms": ms, "peak_mb": mb}
                rows.append(r)
                print(json.dumps(r), flush=True)
            torch.cuda.empty_cache()
    for r in rows:
        ref = "sdpa d128" if r["case"].endswith("d128") else "sdpa"
        base = next(x for x in rows if x["case"] == ref and x["T"] == r["T"] and x["k"] == r["k"])
        if r["fwd_ms"] is not None and base["fwd_ms"] is not None:
            r["fwd_x_sdpa"] = r["fwd_ms"] / base["fwd_ms"]
            r["peak_x_sdpa"] = r["peak_mb"] / base["peak_mb"]
    with open(a.out, "w") as f:
        json.dump({"environment": environment(), "command": "python3 scripts/tune/time_gluon.py " + " ".join(sys.argv[1:]), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
