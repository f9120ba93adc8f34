"""Does triton's Gluon compile a warp-specialised kernel of the forward chain's shape for sm_90a?
Offline (no GPU): two tiny kernels with the chain's data flow and mbarrier hand-offs between
partitions (the design: notes/kernels.md, "Issue 45 step 5").

"roles" (a loader warp, a QK warpgroup, a softmax warpgroup):
  loader   (worker, 1 warp):   cp.async K tiles into a 2-slot ring; kready[s] when landed, waits
                               kfree[s] before refilling a slot
  scores   (worker, 4 warps):  S = K Q^T by wgmma from the ring slot, fp16 S into a 2-slot S ring;
                               sready[s], waits sfree[s]; frees the K slot
  softmax  (default, 4 warps): exp of S, P to shared, O += P V by wgmma (O in registers)
"heads" (the partition the design chooses):
  conv     (default, 8 warps): per window, waits sready[b], one wgmma over X_b (warps [4, 2], the
                               conv's stand-in), overwrites X_b in place, lready[b]
  head j   (4 workers, 1 warp each): QK by mma_v2 (query rows on M) into X_b, sready[b]; waits
                               lready[b]; softmax (row max by shuffles), O += P V by mma_v2; own
                               cp.async K / V tiles

It prints registers, stack, shared memory, the per-partition register requests (USETMAXREG in the
SASS) and a census (mbarrier SYNCS, HGMMA, HMMA, LDSM, BAR, SHFL); a compile error is a traceback.
Nothing runs: the numbers are the compiler's. Needs triton 3.6 (the Gluon API the project's
kernels are written against).

Usage (repository root):
    /path/to/triton-3.6/python scripts/tune/probe_warp_specialize.py [--which heads] [--head-regs 128] [--sass F]
"""

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gluon_compile as gc  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared,  # noqa: E402
                                                               mbarrier, mma_v2, warpgroup_mma)

BM = gl.constexpr(64)  # query rows (the S tile's N); the probe's shapes are wgmma-legal, not the chain's


@gluon.jit
def _loader(K, ring, kready, kfree, n_tiles):
    """1 warp: K tile i -> ring slot i % 2 (cp.async), kready[s] after it landed."""
    L1: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])
    r = gl.arange(0, 64, gl.SliceLayout(1, L1))
    c = gl.arange(0, 64, gl.SliceLayout(0, L1))
    for i in range(n_tiles):
        s = i % 2
        mbarrier.wait(kfree.index(s), ((i // 2) & 1) ^ 1)   # a fresh barrier passes phase 1 at once
        async_copy.async_copy_global_to_shared(ring.index(s), K + (i * 64 + r)[:, None] * 64 + c[None, :])
        async_copy.commit_group()
        async_copy.wait_group(0)
        fence_async_shared()
        mbarrier.arrive(kready.index(s))


@gluon.jit
def _scores(ring, Qs, Sring, kready, kfree, sready, sfree, n_tiles):
    """4 warps: S_i = K_i Q^T (wgmma), fp16 into S slot i % 2 for the softmax partition."""
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
    for i in range(n_tiles):
        s = i % 2
        ph = (i // 2) & 1
        mbarrier.wait(kready.index(s), ph)
        sT = warpgroup_mma(ring.index(s), Qs.permute((1, 0)), gl.zeros([64, BM], gl.float32, ACC), use_acc=False)
        mbarrier.arrive(kfree.index(s))
        mbarrier.wait(sfree.index(s), ph ^ 1)
        Sring.index(s).store(sT.to(gl.float16))
        fence_async_shared()
        mbarrier.arrive(sready.index(s))


@gluon.jit
def _softmax(Sring, Pb, Vs, sready, sfree, O, n_tiles):
    """4 warps (default partition): P = exp(S), O^T += V^T P^T (wgmma), O^T in registers."""
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
    o = gl.zeros([64, BM], gl.float32, ACC)
    for i in range(n_tiles):
        s = i % 2
        mbarrier.wait(sready.index(s), (i // 2) & 1)
        sT = Sring.index(s).load(ACC).to(gl.float32)
        mbarrier.arrive(sfree.index(s))
        Pb.store(gl.exp2(sT).to(gl.bfloat16))
        fence_async_shared()
        o = warpgroup_mma(Vs.permute((1, 0)), Pb, o)
    d = gl.arange(0, 64, gl.SliceLayout(1, ACC))
    m = gl.arange(0, BM, gl.SliceLayout(0, ACC))
    gl.store(O + m[None, :] * 64 + d[:, None], o)


@gluon.jit
def _ws_probe(Q, K, V, O, n_tiles, num_warps: gl.constexpr, REG_LOAD: gl.constexpr, REG_QK: gl.constexpr):
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    NV: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    NVS: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, BM], gl.float16)
    NVP: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, BM], gl.bfloat16)
    BAR: gl.constexpr = mbarrier.MBarrierLayout()
    r = gl.arange(0, 64, gl.SliceLayout(1, LD))
    c = gl.arange(0, 64, gl.SliceLayout(0, LD))
    Qs = gl.allocate_shared_memory(gl.bfloat16, [BM, 64], NV, gl.load(Q + r[:, None] * 64 + c[None, :]))
    Vs = gl.allocate_shared_memory(gl.bfloat16, [64, 64], NV, gl.load(V + r[:, None] * 64 + c[None, :]))
    ring = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 64], NV)
    Sring = gl.allocate_shared_memory(gl.float16, [2, 64, BM], NVS)
    Pb = gl.allocate_shared_memory(gl.bfloat16, [64, BM], NVP)
    kready = gl.allocate_shared_memory(gl.int64, [2, 1], BAR)
    kfree = gl.allocate_shared_memory(gl.int64, [2, 1], BAR)
    sready = gl.allocate_shared_memory(gl.int64, [2, 1], BAR)
    sfree = gl.allocate_shared_memory(gl.int64, [2, 1], BAR)
    for s in gl.static_range(2):
        mbarrier.init(kready.index(s), count=1)
        mbarrier.init(kfree.index(s), count=1)
        mbarrier.init(sready.index(s), count=1)
        mbarrier.init(sfree.index(s), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (_softmax, (Sring, Pb, Vs, sready, sfree, O, n_tiles)),
        (_loader, (K, ring, kready, kfree, n_tiles)),
        (_scores, (ring, Qs, Sring, kready, kfree, sready, sfree, n_tiles)),
    ], [1, 4], [REG_LOAD, REG_QK])


# ---- the partition the design chooses: the conv rows as the default partition (8 warps, as
# chain.py's), and each of 4 one-warp workers owning heads: QK and PV by mma_v2 (rows on M: the row
# maximum is a shuffle in a quad, no exchange between warps), its own cp.async K/V tiles ----
NH = gl.constexpr(4)   # heads of the probe: one per worker warp


@gluon.jit
def _conv_stand_in(Wc, X, sready, lready, n_win):
    """8 warps: per window w (buffer w % 2), wait for every head's S, one wgmma over X_b (conv's shape
    stand-in: M 64, N 64 over two warpgroups), overwrite X_b with the result (the logits L) in place."""
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    LX: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    for w in range(n_win):
        b = w % 2
        mbarrier.wait(sready.index(b), (w // 2) & 1)
        xb = X.index(b)
        y = warpgroup_mma(Wc, xb, gl.zeros([64, 64], gl.float32, ACC), use_acc=False)
        gl.thread_barrier()   # both warpgroups' wgmma have read X_b before it is overwritten
        xb.store(gl.convert_layout(y, LX).to(gl.float16))
        mbarrier.arrive(lready.index(b))


@gluon.jit
def _head_qk(Qs, K, kbuf, X, j, w):
    """One warp: S_j of window w = Q_j K_j^T (mma_v2, [16 rows, 64 keys]) into X_(w % 2) head j."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    L1: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])
    r = gl.arange(0, 64, gl.SliceLayout(1, L1))
    c = gl.arange(0, 64, gl.SliceLayout(0, L1))
    async_copy.async_copy_global_to_shared(kbuf, K + ((w * 64 + r) * NH + j)[:, None] * 64 + c[None, :])
    async_copy.commit_group()
    async_copy.wait_group(0)
    gl.thread_barrier()   # every lane's copies landed before any lane reads the tile
    qa = Qs.slice(16 * j, 16, dim=0).load(gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))
    kb = kbuf.permute((1, 0)).load(gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2))
    s = mma_v2(qa, kb, gl.zeros([16, 64], gl.float32, MMA))
    X.index(w % 2).slice(16 * j, 16, dim=0).store(s.to(gl.float16))


@gluon.jit
def _head_warp(j: gl.constexpr, Qs, K, V, X, kbuf, vbuf, sready, lready, O, n_win):
    """One warp owning head j (its worker index): QK of windows w + 2 while the conv partition holds
    window w + 1; softmax and PV of window w (O in registers); the row maximum within the quad."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    L1: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, 1], [1, 0])
    r = gl.arange(0, 64, gl.SliceLayout(1, L1))
    c = gl.arange(0, 64, gl.SliceLayout(0, L1))
    _head_qk(Qs, K, kbuf, X, j, 0)
    fence_async_shared()
    mbarrier.arrive(sready.index(0))
    _head_qk(Qs, K, kbuf, X, j, 1)
    fence_async_shared()
    mbarrier.arrive(sready.index(1))
    o = gl.zeros([16, 64], gl.float32, MMA)
    m = gl.full([16], -1.0e30, gl.float32, gl.SliceLayout(1, MMA))
    for w in range(n_win):
        b = w % 2
        async_copy.async_copy_global_to_shared(vbuf, V + ((w * 64 + r) * NH + j)[:, None] * 64 + c[None, :])
        async_copy.commit_group()
        mbarrier.wait(lready.index(b), (w // 2) & 1)
        lg = X.index(b).slice(16 * j, 16, dim=0).load(MMA).to(gl.float32)
        m_new = gl.maximum(m, gl.max(lg, axis=1))
        p = gl.exp2(lg - m_new[:, None])
        o = o * gl.exp2(m - m_new)[:, None]
        m = m_new
        async_copy.wait_group(0)
        gl.thread_barrier()
        pa = gl.convert_layout(p.to(gl.bfloat16), gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))
        vb = vbuf.load(gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2))
        o = mma_v2(pa, vb, o)
        if w + 2 < n_win:
            _head_qk(Qs, K, kbuf, X, j, w + 2)
            fence_async_shared()
            mbarrier.arrive(sready.index(b))
    gl.store(O + (j * 16 + gl.arange(0, 16, gl.SliceLayout(1, MMA)))[:, None] * 64
             + gl.arange(0, 64, gl.SliceLayout(0, MMA))[None, :], o)


@gluon.jit
def _ws_probe_heads(Q, K, V, W, O, n_win, num_warps: gl.constexpr, REG_HEAD: gl.constexpr):
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    PL2: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])
    BAR: gl.constexpr = mbarrier.MBarrierLayout()
    r = gl.arange(0, 64, gl.SliceLayout(1, LD))
    c = gl.arange(0, 64, gl.SliceLayout(0, LD))
    Wc = gl.allocate_shared_memory(gl.float16, [64, 64], gl.NVMMASharedLayout.get_default_for([64, 64], gl.float16),
                                   gl.load(W + r[:, None] * 64 + c[None, :]))
    Qs = gl.allocate_shared_memory(gl.bfloat16, [NH * 16, 64], PL2, gl.load(Q + r[:, None] * 64 + c[None, :]))
    X = gl.allocate_shared_memory(gl.float16, [2, NH * 16, 64], gl.NVMMASharedLayout.get_default_for([64, 64], gl.float16))
    k0 = gl.allocate_shared_memory(gl.bfloat16, [64, 64], PL2)
    k1 = gl.allocate_shared_memory(gl.bfloat16, [64, 64], PL2)
    k2 = gl.allocate_shared_memory(gl.bfloat16, [64, 64], PL2)
    k3 = gl.allocate_shared_memory(gl.bfloat16, [64, 64], PL2)
    v0 = gl.allocate_shared_memory(gl.bfloat16, [64, 64], PL2)
    v1 = gl.allocate_shared_memory(gl.bfloat16, [64, 64], PL2)
    v2 = gl.allocate_shared_memory(gl.bfloat16, [64, 64], PL2)
    v3 = gl.allocate_shared_memory(gl.bfloat16, [64, 64], PL2)
    sready = gl.allocate_shared_memory(gl.int64, [2, 1], BAR)
    lready = gl.allocate_shared_memory(gl.int64, [2, 1], BAR)
    for s in gl.static_range(2):
        mbarrier.init(sready.index(s), count=NH)   # one arrival per head warp
        mbarrier.init(lready.index(s), count=1)    # the conv partition's
    fence_async_shared()
    gl.warp_specialize([
        (_conv_stand_in, (Wc, X, sready, lready, n_win)),
        (_head_warp, (0, Qs, K, V, X, k0, v0, sready, lready, O, n_win)),
        (_head_warp, (1, Qs, K, V, X, k1, v1, sready, lready, O, n_win)),
        (_head_warp, (2, Qs, K, V, X, k2, v2, sready, lready, O, n_win)),
        (_head_warp, (3, Qs, K, V, X, k3, v3, sready, lready, O, n_win)),
    ], [1, 1, 1, 1], [REG_HEAD] * 4)


def probe_heads(reg_head: int = 152, sass_path=None) -> dict:
    sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "W": "*fp16", "O": "*fp32", "n_win": "i32"}
    consts = {"num_warps": 8, "REG_HEAD": reg_head}
    tmp = sass_path or "/tmp/lenx_ws_probe_heads.sass"
    out = gc.compile_gluon(_ws_probe_heads, sig, consts, 8, sass_path=tmp, divisible=["Q", "K", "V", "W", "O"])
    return _census(out, Path(tmp).read_text())


def _census(out: dict, sass: str) -> dict:
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    out["setmaxnreg"] = re.findall(r"USETMAXREG\.(\w+)\.\w+\s+(?:UP\d,\s+)?(0x[0-9a-f]+)", sass)
    out["ops"] = {k: sum(o.startswith(k) for o in ops) for k in ("SYNCS", "HGMMA", "HMMA", "LDSM", "BAR", "SHFL")}
    return out


def probe(reg_load: int = 24, reg_qk: int = 240, sass_path=None) -> dict:
    sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*fp32", "n_tiles": "i32"}
    consts = {"num_warps": 4, "REG_LOAD": reg_load, "REG_QK": reg_qk}
    tmp = sass_path or "/tmp/lenx_ws_probe.sass"
    out = gc.compile_gluon(_ws_probe, sig, consts, 4, sass_path=tmp, divisible=["Q", "K", "V", "O"])
    return _census(out, Path(tmp).read_text())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--regs", default="24,240", help="register requests of the loader and scores workers (roles)")
    ap.add_argument("--head-regs", type=int, default=152, help="register request of each head warp (heads)")
    ap.add_argument("--which", choices=("roles", "heads", "both"), default="both")
    ap.add_argument("--sass", default=None, help="write the SASS here (prefix; one file per kernel)")
    a = ap.parse_args()
    import triton

    rl, rq = (int(x) for x in a.regs.split(","))
    res = {"triton": triton.__version__}
    if a.which in ("roles", "both"):
        res["roles"] = {"worker_regs": [rl, rq], **probe(rl, rq, a.sass and a.sass + ".roles")}
    if a.which in ("heads", "both"):
        res["heads"] = {"worker_regs": [a.head_regs] * 4, **probe_heads(a.head_regs, a.sass and a.sass + ".heads")}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
