"""One forward+backward of the bias-only (Kerple-style table) and stick-breaking kernels at
T = 8192 (B 1, H 12, d 64, bf16), for Nsight Compute:
`PYTHONPATH=src ncu --kernel-name regex:... python3 scripts/tune/ncu_target.py`."""

import torch

from lenx.ops.biased_softmax.triton import biased_attention
from lenx.ops.stickbreaking.triton import stickbreaking_triton

T, H, D = 8192, 12, 64
torch.manual_seed(0)
q, k, v = (torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
g = torch.randn_like(q)
tab = (-torch.rand(H, 2 * T - 1, device="cuda")).requires_grad_()
for _ in range(2):  # the first compiles; ncu's --launch-skip passes over it
    biased_attention(q, k, v, tab).backward(g)
    stickbreaking_triton(q, k, v)[0].backward(g)
torch.cuda.synchronize()
print("done")
