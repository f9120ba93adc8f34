"""Session 4: accuracy of the stick-breaking forward with the strict vs the inclusive in-block
suffix (bf16 inputs, fp16 scan product) against the fp32 reference, for growing logit scales.
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
    for suffix in ("strict", "inclusive"):
        sb.CONFIG["suffix"] = (suffix,)
        out, rem = sb.stickbreaking_triton(q, k, v)
        err = float((out.double() - ref).norm() / ref.norm())
        rows.append({"q_scale": scale, "suffix": suffix, "out_rel_err": err,
                     "rem_rel_err": float((rem.double() - ref_rem).norm() / ref_rem.norm())})
        print(rows[-1])
sb.CONFIG["suffix"] = ("strict",)
print(json.dumps(rows))
