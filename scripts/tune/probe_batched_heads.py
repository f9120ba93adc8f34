"""Does Gluon (triton 3.6, sm_90a, offline) compile the head warps of chain_ws.py as ONE 4-warp worker
partition whose tensors carry the warp's head as a leading batch dimension (mma_v2 with
warps_per_cta [4, 1, 1]: each warp multiplies its own head's [16, 64] x [64, 64] tiles), beside an
8-warp default partition, at 168 registers? If so, the head code exists once instead of once per
warp (notes/kernels.md, "why the warp-specialised chain did not overlap"). The probe's shapes: per
window, two head groups of QK into a hand-off buffer, an mbarrier hand-off to the default partition
(a stand-in), then softmax and PV per group with O in shared memory; K and V tiles by cp.async.
Prints the compile's registers, spills and shared memory, and ws_sass_regions.py's census per
partition (one head region, its loop's HMMA, barriers, code bytes). Nothing runs.

Usage (repository root):
    /path/to/triton-3.6/python scripts/tune/probe_batched_heads.py [--sass F]
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gluon_compile as gc  # noqa: E402
import ws_sass_regions as wr  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared,  # noqa: E402
                                                               mbarrier, mma_v2, warpgroup_mma)

GROUPS = gl.constexpr(2)   # head groups per window (the chain has 3 at H 12; 2 keep the probe's buffers small)


@gluon.jit
def _stand_in(Wc, Out, sready, lready, n_win):
    """8 warps (default): per window wait for the heads' S, one wgmma (the conv's place), hand back."""
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    y = gl.zeros([64, 64], gl.float32, ACC)
    for w in range(n_win):
        mbarrier.wait(sready.index(w % 2), (w // 2) & 1)
        y = warpgroup_mma(Wc, Wc, y)
        gl.thread_barrier()
        mbarrier.arrive(lready.index(w % 2))
    gl.store(Out + gl.arange(0, 64, gl.SliceLayout(1, ACC))[:, None] * 64
             + gl.arange(0, 64, gl.SliceLayout(0, ACC))[None, :], y)


@gluon.jit
def _heads(X, tiles, Os, sready, lready, K, V, n_win):
    """4 warps, warp i = batch entry i = its own head of each group: QK, hand-off, softmax, PV."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1], instr_shape=[1, 16, 8])
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 4, 8], [4, 1, 1], [2, 1, 0])
    h = gl.arange(0, 4, gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    r = gl.arange(0, 64, gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    c = gl.arange(0, 64, gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    off = h[:, None, None] * 4096 + r[None, :, None] * 64 + c[None, None, :]
    for w in range(n_win):
        for t in gl.static_range(GROUPS):
            async_copy.async_copy_global_to_shared(tiles, K + off + (w * GROUPS + t) * 16384)
            async_copy.commit_group()
            async_copy.wait_group(0)
            gl.thread_barrier()
            qa = X.index(GROUPS * (w % 2) + t).load(gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))
            kb = tiles.permute((0, 2, 1)).load(gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2))
            s = mma_v2(qa, kb, gl.zeros([4, 16, 64], gl.float32, MMA))
            X.index(GROUPS * (w % 2) + t).store(s.to(gl.bfloat16))
        mbarrier.arrive(sready.index(w % 2))
        mbarrier.wait(lready.index(w % 2), (w // 2) & 1)
        for t in gl.static_range(GROUPS):
            lg = X.index(GROUPS * (w % 2) + t).load(MMA).to(gl.float32)
            p = gl.exp2(lg - gl.max(lg, axis=2)[:, :, None])   # a row's max: within the warp's quad
            pa = gl.convert_layout(p.to(gl.bfloat16), gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))
            async_copy.async_copy_global_to_shared(tiles, V + off + (w * GROUPS + t) * 16384)
            async_copy.commit_group()
            async_copy.wait_group(0)
            gl.thread_barrier()
            vb = tiles.load(gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2))
            o = Os.index(t)
            o.store(mma_v2(pa, vb, o.load(MMA)))


@gluon.jit
def _probe(K, V, W, Out, n_win, num_warps: gl.constexpr):
    PLAIN3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    r = gl.arange(0, 64, gl.SliceLayout(1, LD))
    c = gl.arange(0, 64, gl.SliceLayout(0, LD))
    Wc = gl.allocate_shared_memory(gl.bfloat16, [64, 64], gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16),
                                   gl.load(W + r[:, None] * 64 + c[None, :]))
    X = gl.allocate_shared_memory(gl.bfloat16, [2 * GROUPS, 4, 16, 64], PLAIN3)   # two windows' S / L
    Os = gl.allocate_shared_memory(gl.float32, [GROUPS, 4, 16, 64], PLAIN3)
    tiles = gl.allocate_shared_memory(gl.bfloat16, [4, 64, 64], gl.SwizzledSharedLayout(8, 1, 8, [2, 1, 0]))
    BAR: gl.constexpr = mbarrier.MBarrierLayout()
    sready = gl.allocate_shared_memory(gl.int64, [2, 1], BAR)
    lready = gl.allocate_shared_memory(gl.int64, [2, 1], BAR)
    for i in gl.static_range(2):
        mbarrier.init(sready.index(i), count=1)   # the head partition arrives once (elected)
        mbarrier.init(lready.index(i), count=1)
    fence_async_shared()
    gl.warp_specialize([(_stand_in, (Wc, Out, sready, lready, n_win)),
                        (_heads, (X, tiles, Os, sready, lready, K, V, n_win))], [4], [168])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sass", default=None, help="write the SASS here")
    a = ap.parse_args()
    sig = {"K": "*bf16", "V": "*bf16", "W": "*bf16", "Out": "*fp32", "n_win": "i32"}
    path = a.sass or str(Path(tempfile.mkdtemp()) / "probe.sass")
    out = gc.compile_gluon(_probe, sig, {"num_warps": 8}, 8, sass_path=path, divisible=["K", "V", "W", "Out"])
    print(json.dumps({k: out[k] for k in ("registers", "stack_bytes", "shared_bytes", "ptx_target")}))
    for reg in wr.analyse(Path(path).read_text()):
        if reg["instructions"] > 20:
            print(json.dumps({k: v for k, v in reg.items() if k != "loops"}))
            for lp in reg["loops"]:
                print("   loop", json.dumps(lp))


if __name__ == "__main__":
    main()
