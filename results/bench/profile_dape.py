"""Forward passes of the two DAPE V2 forward kernels (windowed, channels-first) at T = 8192 (B 1,
H 12, d 64, k 3, D 32, Kerple table, bf16), for Nsight Compute:
`ncu --kernel-name regex:_dape_fwd python3 THIS`."""

import torch

from lenx.attention import DapeV2, KerpleLog
from lenx.ops.dape_v2 import triton as dape

T, H, D = 8192, 12, 64
torch.manual_seed(0)
q, k, v = (torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
proc = DapeV2(H, 32, 3).cuda()
tab = KerpleLog(H).cuda().table(T, torch.device("cuda")).detach()
with torch.no_grad():
    for forward in [("windowed",), ("channels_first", 16, 32, 8, 1)]:
        dape.FORWARD = forward
        for _ in range(2):  # the first compiles; ncu's --launch-skip passes over it
            dape.dape_v2_triton(q, k, v, proc, tab)
torch.cuda.synchronize()
print("done")
