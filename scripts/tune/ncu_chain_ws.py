"""The DAPE V2 forward chain (chain.py) and its warp-specialised form (chain_ws.py), each launched
twice at T 8192 (B 1, H 12, d 64, D 32, k 3, Kerple, bf16; the first launch compiles), for Nsight
Compute: where the warps of each kernel stall (no instruction: the instruction caches; long
scoreboard: the cp.async tiles and t2 loads; barrier: the conv partition's 256-thread barriers and the
head partition's 128-thread ones).
Run one kernel per ncu call, skipping its compiling launch:

    PYTHONPATH=src ncu --kernel-name regex:_dape_v2_chain_ws --launch-skip 1 --launch-count 1 \\
        --section WarpStateStats --section SchedulerStats --section InstructionStats \\
        --section SourceCounters -o ws python3 scripts/tune/ncu_chain_ws.py
    (and --kernel-name regex:_dape_v2_chain$ -o chain for chain.py's)
    ncu --import ws.ncu-rep --page source --print-source sass --csv > ws_source.csv

The source page's stall samples per SASS address fall in the partitions that
scripts/tune/ws_sass_regions.py lists (region starts) for the same triton's compile.
"""

import torch

from lenx.attention import DapeV2, KerpleLog
from lenx.ops.dape_v2 import chain as C
from lenx.ops.dape_v2 import chain_ws as CW
from lenx.ops.dape_v2 import gluon as G

T, H, D, KS = 8192, 12, 32, 3
dev = torch.device("cuda")
torch.manual_seed(0)
w = [x.detach() for x in DapeV2(H, D, KS, with_bias=True).to(dev).conv_weights()]
q, k, v = (torch.randn(1, H, T, 64, device=dev, dtype=torch.bfloat16) for _ in range(3))
with torch.no_grad():
    prepared = G.prepare(*w, KerpleLog(H).to(dev).table(T, dev).detach(), T, H, dev)
    for _ in range(2):
        C.dape_v2_chain_forward(q, k, v, *w, prepared=prepared)
        CW.dape_v2_chain_ws_forward(q, k, v, *w, prepared=prepared)
torch.cuda.synchronize()
print("done")
