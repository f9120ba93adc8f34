"""Per-kernel GPU times of one forward+backward (torch.profiler, CUDA activity), bf16, B 1, H 12:
DAPE V2 + Kerple (k 3, D 32, d 64) and the Kerple bias-only kernels at d 64 and d 128, T 8192.
Usage (repository root on a CUDA machine): PYTHONPATH=src python3 scripts/tune/kernel_times.py OUT.json"""
import json
import sys

import torch

from lenx.attention import DapeV2, KerpleLog
from lenx.ops.biased_softmax.triton import biased_attention
from lenx.ops.dape_v2.triton import dape_v2_triton

T, H = 8192, 12
dev = torch.device("cuda")


def run_case(name, fn, d):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, T, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn_like(q)
    for _ in range(2):  # compile and warm up
        fn(q, k, v).backward(g)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn(q, k, v).backward(g)
        torch.cuda.synchronize()
    times = {}
    for e in prof.key_averages():
        if e.device_time_total > 0:
            times[e.key] = {"ms_per_call": e.device_time_total / 1000 / 3, "calls_per_iter": e.count / 3}
    rows = sorted(times.items(), key=lambda kv: -kv[1]["ms_per_call"])
    print(name, [(k[:40], round(v["ms_per_call"], 3)) for k, v in rows[:8]], flush=True)
    return {"case": name, "kernels": dict(rows)}


kb = KerpleLog(H).to(dev)
proc = DapeV2(H, 32, 3, with_bias=True).to(dev)
out = [run_case("dapev2-kerple d64", lambda q, k, v: dape_v2_triton(q, k, v, *proc.conv_weights(), kb.table(T, dev)), 64),
       run_case("kerple d64", lambda q, k, v: biased_attention(q, k, v, kb.table(T, dev), **kb.fused_grad_args()), 64),
       run_case("kerple d128", lambda q, k, v: biased_attention(q, k, v, kb.table(T, dev), **kb.fused_grad_args()), 128)]
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "T": T, "H": H, "cases": out},
          open(sys.argv[1], "w"), indent=1)
