"""One forward+backward of a copy of the skewed DAPE V2 kernels (scripts/tune/_variants/NAME.py, as
time_variants.py makes them) at B x T, H 12, d 64, k 3, D 32, bf16, for Nsight Compute or
compute-sanitizer. The first pass compiles; profile the second (ncu --launch-skip 1).
Usage: PYTHONPATH=$PWD/src:$PWD/scripts/tune python3 scripts/tune/ncu_skewed.py NAME BxT [KERNEL=BM,BN,W,S]"""
import importlib.util
import sys
from pathlib import Path

import torch

from lenx.attention import DapeV2, KerpleLog

name, shape = sys.argv[1], sys.argv[2]
B, T = (int(x) for x in shape.split("x"))
cfg = {}
for arg in sys.argv[3:]:
    kernel, tiles = arg.split("=")
    cfg[kernel] = tuple(int(x) for x in tiles.split(","))
spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / "_variants" / f"{name}.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
dev = torch.device("cuda")
torch.manual_seed(0)
kb = KerpleLog(12).to(dev)
proc = DapeV2(12, 32, 3, with_bias=True).to(dev)
q, k, v = (torch.randn(B, 12, T, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
g = torch.randn_like(q)
for _ in range(2):
    out = mod.dape_v2_skewed(q, k, v, *proc.conv_weights(), kb.table(T, dev), config=cfg or None)
    out.backward(g)
torch.cuda.synchronize()
print("done", name, B, T, cfg, float(q.grad.float().abs().sum()))
