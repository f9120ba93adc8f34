"""Timings straight through the kernels (no attention module) at one length, bf16, B 1: the
bias-only kernel's forward with and without a bias, forward+backward with and without the table
gradient and with no bias; a Kerple log module's r1, r2 gradients through the table gradient or
straight from the kernel; stick-breaking forward and forward+backward; fused SDPA.

Usage (repository root, CUDA machine): PYTHONPATH=src python3 scripts/tune/probe.py [--t 8192] -o out.json
"""

import argparse
import json

import torch

from lenx.attention import KerpleLog
from lenx.bench.kernels import median_ms
from lenx.ops.biased_softmax.triton import biased_attention
from lenx.ops.stickbreaking.triton import stickbreaking_triton
from lenx.runinfo import environment


def probe(T: int, heads: int, head_dim: int) -> dict:
    device = torch.device("cuda")
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, T, head_dim, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn_like(q)
    tab = -torch.rand(heads, 2 * T - 1, device=device)
    tab_g = tab.clone().requires_grad_()
    kb = KerpleLog(heads).to(device)
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    forward = {
        "fwd": lambda: biased_attention(q, k, v, tab),
        "fwd_no_bias": lambda: biased_attention(q, k, v, None),
        "sb_fwd": lambda: stickbreaking_triton(q, k, v)[0],
        "sdpa_fwd": sdpa,
    }
    backward = {
        "fwdbwd_table_grad": (lambda: biased_attention(q, k, v, tab_g).backward(g), (q, k, v, tab_g)),
        "fwdbwd_no_table_grad": (lambda: biased_attention(q, k, v, tab).backward(g), (q, k, v)),
        "fwdbwd_no_bias": (lambda: biased_attention(q, k, v, None).backward(g), (q, k, v)),
        "fwdbwd_kerple_via_table": (lambda: biased_attention(q, k, v, kb.table(T, device)).backward(g),
                                    (q, k, v, kb.r1, kb.r2)),
        "fwdbwd_kerple_params": (lambda: biased_attention(q, k, v, kb.table(T, device), **kb.fused_grad_args())
                                 .backward(g), (q, k, v, kb.r1, kb.r2)),
        "sb_fwdbwd": (lambda: stickbreaking_triton(q, k, v)[0].backward(g), (q, k, v)),
        "sdpa_fwdbwd": (lambda: sdpa().backward(g), (q, k, v)),
    }
    out = {}
    with torch.no_grad():
        for name, fn in forward.items():
            out[name] = median_ms(fn, 25, 200, 50)[0]
    for name, (fn, leaves) in backward.items():
        out[name] = median_ms(fn, 25, 200, 50, leaves)[0]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--t", type=int, default=8192)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("-o", "--out", required=True)
    a = p.parse_args()
    times = probe(a.t, a.heads, a.head_dim)
    print(", ".join(f"{k}={v:.3f} ms" for k, v in times.items()))
    with open(a.out, "w") as f:
        json.dump({"environment": environment(torch.device("cuda")), "T": a.t, "ms": times}, f, indent=1)


if __name__ == "__main__":
    main()
