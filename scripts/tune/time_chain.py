"""The DAPE V2 forward chain (lenx.ops.dape_v2.chain) against gluon.py's forward and causal SDPA, as
evaluation runs it: bf16, B 1, H 12, d 64, D 32, k 3, Kerple, no autograd graph, host tables built
once outside the timing (tables.cached does that in the model). Back-to-back medians
(lenx.bench.kernels.median_ms), the chain's output checked against gluon.py's on the same inputs,
one JSON file out. With --rings, the chain once per K/V ring size (chain.ring_sizes: 2 is the
default), each checked bit-equal to ring 2's output. With --ws, also the warp-specialised chain
(chain_ws.py), checked against the chain's output. About 30-60 s on an H200 (+ ~10 s a ring), most
of it the kernels' first compile.

Usage (repository root, sm_90 GPU, triton 3.6):
    PYTHONPATH=src python3 scripts/tune/time_chain.py chain_times.json [--lengths 8192,16384] [--rings 2,3,4] [--ws]
"""

import argparse
import json
import sys

import torch
from torch.nn import functional as F

from lenx.attention import DapeV2, KerpleLog
from lenx.bench.kernels import median_ms
from lenx.ops.dape_v2 import chain as C
from lenx.ops.dape_v2 import chain_ws as CW
from lenx.ops.dape_v2 import gluon as G
from lenx.runinfo import environment, kernel_sources_hash


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--lengths", default="8192,16384")
    ap.add_argument("--rings", default="2", help="K/V ring sizes of the chain, comma-separated (default 2)")
    ap.add_argument("--ws", action="store_true", help="also time the warp-specialised chain (chain_ws.py)")
    a = ap.parse_args()
    H, dh, D, ks = 12, 64, 32, 3
    try:
        lengths = [int(x) for x in a.lengths.split(",")]
        rings = [int(x) for x in a.rings.split(",")]
    except ValueError:
        ap.exit(2, "error: --lengths and --rings take comma-separated integers\n")
    if 2 not in rings or not set(rings) <= set(C.ring_sizes(H)):
        ap.exit(2, f"error: --rings must include 2 and be among {C.ring_sizes(H)} at H {H} (got {a.rings})\n")
    dev = torch.device("cuda")
    proc = DapeV2(H, D, ks, with_bias=True).to(dev)
    w = [x.detach() for x in proc.conv_weights()]
    kb = KerpleLog(H).to(dev)
    rows = []
    for T in lengths:
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, H, T, dh, device=dev, dtype=torch.bfloat16) for _ in range(3))
        with torch.no_grad():
            prepared = G.prepare(*w, kb.table(T, dev).detach(), T, H, dev)
            cases = {
                "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                "gluon": lambda: G.dape_v2_gluon_forward(q, k, v, *w, prepared=prepared),
                "chain": lambda: C.dape_v2_chain_forward(q, k, v, *w, prepared=prepared),
            }
            for r in rings[1:]:
                cases[f"chain_ring{r}"] = lambda r=r: C.dape_v2_chain_forward(q, k, v, *w, prepared=prepared, ring=r)
            if a.ws:
                cases["chain_ws"] = lambda: CW.dape_v2_chain_ws_forward(q, k, v, *w, prepared=prepared)
            og, lg = cases["gluon"]()
            oc, lc = cases["chain"]()
            err = ((oc.float() - og.float()).norm() / og.float().norm()).item()
            row = {"T": T, "chain_vs_gluon_rel_err": err, "chain_vs_gluon_lse_max_abs": (lc - lg).abs().max().item()}
            for r in rings[1:]:
                o_r, l_r = cases[f"chain_ring{r}"]()
                row[f"chain_ring{r}_bits_equal"] = bool(torch.equal(o_r, oc) and torch.equal(l_r, lc))
            if a.ws:
                ow, lw = cases["chain_ws"]()
                row["ws_vs_chain_rel_err"] = ((ow.float() - oc.float()).norm() / oc.float().norm()).item()
                row["ws_vs_chain_lse_max_abs"] = (lw - lc).abs().max().item()
            for name, fn in cases.items():
                row[f"{name}_ms"] = median_ms(fn, 25, 200, 20)[0]
        row["gluon_x_sdpa"] = row["gluon_ms"] / row["sdpa_ms"]
        row["chain_x_sdpa"] = row["chain_ms"] / row["sdpa_ms"]
        row["chain_speedup_vs_gluon"] = row["gluon_ms"] / row["chain_ms"]
        for r in rings[1:]:
            row[f"chain_ring{r}_x_sdpa"] = row[f"chain_ring{r}_ms"] / row["sdpa_ms"]
        if a.ws:
            row["chain_ws_x_sdpa"] = row["chain_ws_ms"] / row["sdpa_ms"]
            row["ws_speedup_vs_chain"] = row["chain_ms"] / row["chain_ws_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(a.out, "w") as f:
        json.dump({"environment": environment(), "kernel_sources_hash": kernel_sources_hash(),
                   "command": "python3 scripts/tune/time_chain.py " + " ".join(sys.argv[1:]), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
