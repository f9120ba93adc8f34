"""Accuracy of the fused stick-breaking forward (bf16 inputs) against the fp64 reference for growing
logit scales (q multiplied by 1, 2, 4, 8), T 2048, H 12, d 64. Session 4 ran an earlier version of
this script at commit a6661f9, where it also timed the strict in-block suffix (results/bench/README.md).
Usage (repository root on a CUDA machine): PYTHONPATH=src python3 results/bench/sb_suffix_check.py"""
import json

import torch

from lenx.ops.stickbreaking import triton as sb
from lenx.ops.stickbreaking.reference import stickbreaking_reference

torch.manual_seed(0)
rows = []
for scale in (1.0, 2.0, 4.0, 8.0):
    q, k, v = (torch.randn(1, 12, 2048, 64, device="cuda").bfloat16() for _ in range(3))
    q = (q.float() * scale).bfloat16()
    ref, ref_rem = stickbreaking_reference(q.double(), k.double(), v.double())
    out, rem = sb.stickbreaking_triton(q, k, v)
    rows.append({"q_scale": scale, "out_rel_err": float((out.double() - ref).norm() / ref.norm()),
                 "rem_rel_err": float((rem.double() - ref_rem).norm() / ref_rem.norm())})
    print(rows[-1])
print(json.dumps(rows))
