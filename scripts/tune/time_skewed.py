"""GPU kernel time of one attention layer's forward+backward at the 125m training shapes (torch.profiler,
CUDA activity, every kernel counted once), bf16, H 12, d 64: SDPA, Kerple (fused), DAPE V2-Kerple
(k 3, D 32) on the Triton kernel and on the skewed kernels (buffers kept, and recomputed), with a
correctness check of the skewed path against the fp32 dense reference first.
Usage (repository root on a CUDA machine): PYTHONPATH=src python3 scripts/tune/time_skewed.py OUT.json [SHAPES [sweep]]
SHAPES: comma-separated BxT (default 32x512,8x2048,256x128); a third argument `sweep` times each conv
kernel's tile settings at the first shape instead (`sweep KERNEL BM,BN,WARPS,STAGES`: one setting)."""
import json
import sys

import torch
from torch.nn import functional as F

from lenx.attention import DapeV2, KerpleLog
from lenx.ops.biased_softmax.triton import biased_attention
from lenx.ops.dape_v2.reference import dape_v2_reference
from lenx.ops.dape_v2.skewed import dape_v2_skewed
from lenx.ops.dape_v2.triton import dape_v2_triton

H, d = 12, 64
dev = torch.device("cuda")
torch.manual_seed(0)
kb = KerpleLog(H).to(dev)
proc = DapeV2(H, 32, 3, with_bias=True).to(dev)
params = list(kb.parameters()) + list(proc.parameters())

CASES = {
    "sdpa": lambda q, k, v, T: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "kerple": lambda q, k, v, T: biased_attention(q, k, v, kb.table(T, dev), **kb.fused_grad_args()),
    "dapev2-triton": lambda q, k, v, T: dape_v2_triton(q, k, v, *proc.conv_weights(), kb.table(T, dev)),
    "dapev2-skewed": lambda q, k, v, T: dape_v2_skewed(q, k, v, *proc.conv_weights(), kb.table(T, dev)),
    "dapev2-skewed-recompute": lambda q, k, v, T: dape_v2_skewed(q, k, v, *proc.conv_weights(), kb.table(T, dev),
                                                                 keep=False),
}


def sweep(B, T, only=None):
    """One kernel's GPU time at one shape for several tile settings (BM rows x BN distances, warps,
    stages), the other kernels at their defaults. only: (kernel, tiles), one setting (an illegal
    address poisons the CUDA context: run each setting in its own process)."""
    settings = {only[0]: (only[1],)} if only else {
        "conv_dy": ((8, 16, 8, 1), (4, 16, 4, 1), (8, 16, 4, 1), (16, 16, 8, 1), (4, 32, 8, 1), (8, 32, 8, 1),
                    (2, 32, 4, 1), (8, 32, 4, 1), (16, 32, 8, 1), (8, 16, 8, 2)),
        "conv_z": ((8, 16, 8, 1), (16, 16, 8, 1), (8, 32, 8, 1), (16, 32, 8, 1)),
        "conv_f": ((8, 16, 8, 1), (16, 16, 8, 1), (8, 32, 8, 1), (16, 32, 8, 1)),
        "conv_dx": ((8, 16, 8, 1), (16, 16, 8, 1), (8, 32, 8, 1), (16, 32, 8, 1)),
    }
    rows = []
    for kernel, options in settings.items():
        for tiles in options:
            cfg = {kernel: tiles}
            CASES["sweep"] = lambda q, k, v, T, cfg=cfg: dape_v2_skewed(q, k, v, *proc.conv_weights(),
                                                                         kb.table(T, dev), config=cfg)
            try:
                row = profile("sweep", B, T)
                row["kernel_ms"] = row["kernels"].get("_" + kernel)
            except Exception as err:  # noqa: BLE001
                row = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
            row.update(kernel=kernel, tiles=tiles)
            print("sweep", kernel, tiles, row.get("kernel_ms", row.get("error")), flush=True)
            rows.append(row)
    del CASES["sweep"]
    return rows


def check(B, T):
    """Relative max errors of the skewed path (bf16) against the fp32 dense reference."""
    q, k, v = (torch.randn(B, H, T, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn_like(q)
    leaves = [q, k, v] + params
    out = CASES["dapev2-skewed"](q, k, v, T)
    got = torch.autograd.grad(out, leaves, g)
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = dape_v2_reference(qf, kf, vf, *proc.conv_weights(), kb.table(T, dev))
    want = torch.autograd.grad(ref, [qf, kf, vf] + params, g.float())
    names = ["out", "q", "k", "v"] + [n for n, _ in list(kb.named_parameters()) + list(proc.named_parameters())]
    errs = {}
    for name, a, b in zip(names, (out,) + got, (ref,) + want):
        errs[name] = ((a.float() - b).abs().max() / b.abs().max().clamp(min=1e-6)).item()
    print(f"check B={B} T={T}", {n: f"{e:.1e}" for n, e in errs.items()}, flush=True)
    return {"B": B, "T": T, "rel_max_err": errs}


def profile(name, B, T, iters=3):
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn_like(q)
    fn = CASES[name]

    def step():
        for x in [q, k, v] + params:
            x.grad = None
        fn(q, k, v, T).backward(g)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.key_averages():
        if e.self_device_time_total > 0:
            kernels[e.key] = round(e.self_device_time_total / 1000 / iters, 4)
    total = sum(kernels.values())
    top = dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:10])
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"{name:>24} B={B:>3} T={T:>5} {total:8.3f} ms  peak {peak:.2f} GiB", {k[:28]: v for k, v in top.items()},
          flush=True)
    return {"case": name, "B": B, "T": T, "gpu_ms": total, "peak_gib": peak, "kernels": top}


def registers():
    """Registers and spills of every compiled skewed kernel (triton's JIT caches)."""
    from lenx.ops.dape_v2 import skewed

    out = {}
    for name in ("_scores", "_conv_z", "_conv_f", "_attn_fwd", "_attn_bwd", "_conv_dy", "_conv_dx", "_dq", "_dk"):
        fn = getattr(skewed, name)
        try:
            for cache in fn.device_caches.values():
                for kern in cache[0].values():
                    out.setdefault(name, []).append({"regs": kern.n_regs, "spills": kern.n_spills})
        except Exception as err:  # noqa: BLE001
            out[name] = repr(err)[:200]
    print("registers", out, flush=True)
    return out


def main():
    import triton

    shapes = [tuple(int(x) for x in s.split("x")) for s in (sys.argv[2] if len(sys.argv) > 2 else
                                                           "32x512,8x2048,256x128").split(",")]
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "H": H, "d": d, "D": 32, "k": 3, "dtype": "bfloat16", "checks": [], "rows": []}
    if "sweep" in sys.argv[3:]:
        only = (sys.argv[4], tuple(int(x) for x in sys.argv[5].split(","))) if len(sys.argv) > 5 else None
        res["sweep"] = sweep(*shapes[0], only)
        res["registers"] = registers()
        json.dump(res, open(sys.argv[1], "w"), indent=1)
        return
    for B, T in ((2, 1000), (1, 4096)):
        res["checks"].append(check(B, T))
    for B, T in shapes:
        base = None
        for name in CASES:
            try:
                row = profile(name, B, T)
            except Exception as err:  # noqa: BLE001  (record and go on)
                row = {"case": name, "B": B, "T": T, "error": f"{type(err).__name__}: {str(err)[:300]}"}
                print(row, flush=True)
            if name == "sdpa":
                base = row.get("gpu_ms")
            if base and "gpu_ms" in row:
                row["x_sdpa"] = row["gpu_ms"] / base
            res["rows"].append(row)
            json.dump(res, open(sys.argv[1], "w"), indent=1)
    res["registers"] = registers()
    json.dump(res, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
