"""Compile lenx's Gluon kernels for sm_90a without a GPU and report registers, spills (STACK, local
memory), shared memory and a census of the SASS (tensor-core ops, shuffles, local and shared memory
traffic). Needs a triton whose Gluon API matches src/lenx/ops/dape_v2/gluon.py (3.6; see
notes/gluon.md); torch is not needed.

Usage (repository root):
    /work/venv-t36/bin/python scripts/tune/gluon_compile.py            # the DAPE V2 forward, H 12, k 3
    /work/venv-t36/bin/python scripts/tune/gluon_compile.py --heads 16 --k 5 --sass /tmp/fwd.sass
    /work/venv-t36/bin/python scripts/tune/gluon_compile.py --probes   # the shift probes of notes/gluon.md,
                                                                       # and the register-A probes of K_C
"""

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
TARGET = GPUTarget("cuda", 90, 32)  # capability 90 -> ptx .target sm_90a; warp size 32

# SASS opcodes worth counting (prefix match on the mnemonic)
CENSUS = ("HGMMA", "WARPGROUP", "SHFL", "LDL", "STL", "LDS", "STS", "LDSM", "STSM", "LDG", "STG", "BAR",
          "MUFU", "SEL", "MOV", "PRMT", "FADD", "FMUL", "FFMA", "F2F", "F2FP")


def sass_census(sass: str) -> dict:
    counts = {k: 0 for k in CENSUS}
    total = 0
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if not m:
            continue
        total += 1
        op = m[1]
        for k in CENSUS:
            if op == k or op.startswith(k + "_") or (op.startswith(k) and k in ("HGMMA", "SHFL", "BAR", "MUFU")):
                counts[k] += 1
                break
    counts["total"] = total
    return counts


def compile_gluon(fn, signature: dict, constexprs: dict, num_warps: int = 4, sass_path=None, divisible=(), **options):
    """Compile a gluon.jit function for sm_90a; returns registers, stack bytes, shared bytes, census.
    `divisible`: arguments to mark divisible by 16, as triton's launcher does for pointers and integers
    that are at run time (cp.async needs the row alignment that this gives)."""
    from triton.experimental.gluon._runtime import GluonASTSource
    sig = dict(signature)
    for name in constexprs:
        sig[name] = "constexpr"
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = GluonASTSource(fn, sig, constexprs=dict(constexprs), attrs=attrs)
    k = triton.compile(src, target=TARGET, options={"num_warps": num_warps, **options})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(k.asm["cubin"])
        res = subprocess.run([str(BIN / "cuobjdump"), "-res-usage", str(cubin)],
                             capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([str(BIN / "cuobjdump"), "-sass", str(cubin)],
                              capture_output=True, text=True, check=True).stdout
    if sass_path:
        Path(sass_path).write_text(sass)
    regs = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    local = re.search(r"LOCAL:(\d+)", res)
    return {"registers": int(regs[1]), "stack_bytes": int(stack[1]) if stack else 0,
            "local_bytes": int(local[1]) if local else 0, "shared_bytes": k.metadata.shared,
            "ptx_target": re.findall(r"\.target (\S+)", k.asm["ptx"])[0], "sass": sass_census(sass)}


# ---- shift probes (notes/gluon.md, "Stage 2"): a [128, 64] conv accumulator from a real wgmma, then
# y[c, j] = Y0[c, j - 1] + Y1[c, j] + Y2[c, j + 1] along the 64 keys, five ways ----
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, fence_async_shared  # noqa: E402


@gluon.jit
def _conv_y(W, X):
    """Y [128, 64] fp32 in the wgmma accumulator layout from W [128, 16] and X [16, 64] fp16."""
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    r = gl.arange(0, 128, gl.SliceLayout(1, blk))
    c = gl.arange(0, 16, gl.SliceLayout(0, blk))
    w_s = gl.allocate_shared_memory(gl.float16, [128, 16], gl.NVMMASharedLayout.get_default_for([128, 16], gl.float16),
                                    gl.load(W + r[:, None] * 16 + c[None, :]))
    r2 = gl.arange(0, 16, gl.SliceLayout(1, blk))
    c2 = gl.arange(0, 64, gl.SliceLayout(0, blk))
    x_s = gl.allocate_shared_memory(gl.float16, [16, 64], gl.NVMMASharedLayout.get_default_for([16, 64], gl.float16),
                                    gl.load(X + r2[:, None] * 64 + c2[None, :]))
    fence_async_shared()
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    return warpgroup_mma(w_s, x_s, gl.zeros([128, 64], gl.float32, ACC))


@gluon.jit
def _taps(y):
    """[128, 64] accumulator -> the 4 tap tiles [32 c, 4 q, 16 u] (rows 64 a + 8 rb hold tap 2 a + rb),
    key column n = 8 m + 2 q + b read as u = 2 m + b: pure renames (reshape / permute / split)."""
    y = gl.reshape(y, [2, 4, 2, 8, 8, 4, 2])          # a, w, rb, lh, m, q, b
    y = gl.permute(y, [1, 3, 5, 4, 6, 0, 2])          # w, lh, q, m, b, a, rb
    y = gl.reshape(y, [32, 4, 16, 2, 2])
    ya, yb = gl.split(y)                              # rb = 0, 1
    t0, t2 = gl.split(ya)                             # a = 0, 1
    t1, t3 = gl.split(yb)
    return t0, t1, t2, t3


@gluon.jit
def _store_cqu(Out, v):
    """Store a [32, 4, 16] tile (any layout) as out[c, 16 q + u]."""
    L: gl.constexpr = v.type.layout
    c = gl.arange(0, 32, gl.SliceLayout(1, gl.SliceLayout(2, L)))
    q = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(2, L)))
    u = gl.arange(0, 16, gl.SliceLayout(0, gl.SliceLayout(1, L)))
    off = c[:, None, None] * 64 + q[None, :, None] * 16 + u[None, None, :]
    gl.store(Out + off, v)


@gluon.jit
def probe_gather_u(W, X, Out):
    """Shift along the in-thread u axis with gl.gather (clamped index), plus the neighbour lane's edge
    value via a gather along q: y[u] = t0[u - 1] + t1[u] + t2[u + 1]."""
    t0, t1, t2, t3 = _taps(_conv_y(W, X))
    L: gl.constexpr = t0.type.layout
    u = gl.arange(0, 16, gl.SliceLayout(0, gl.SliceLayout(1, L)))[None, None, :]
    q = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(2, L)))[None, :, None]
    zero = gl.zeros([32, 4, 16], gl.int32, L)
    left = gl.gather(t0, zero + gl.maximum(u - 1, 0), 2)
    right = gl.gather(t2, zero + gl.minimum(u + 1, 15), 2)
    # edges: u = 0 takes t0[q - 1, 15]; u = 15 takes t2[q + 1, 0] (gathers along the lane axis q)
    l_edge = gl.gather(gl.gather(t0, zero + 15, 2), (zero + q + 3) % 4, 1)
    r_edge = gl.gather(gl.gather(t2, zero, 2), (zero + q + 1) % 4, 1)
    left = gl.where(u == 0, l_edge, left)
    right = gl.where(u == 15, r_edge, right)
    _store_cqu(Out, left + t1 + right)


@gluon.jit
def probe_gather_flat(W, X, Out):
    """The same shift as one gather along a flat 64-key axis n' = 16 q + u (warp-local gather)."""
    t0, t1, t2, t3 = _taps(_conv_y(W, X))
    f0 = gl.reshape(t0, [32, 64])
    f1 = gl.reshape(t1, [32, 64])
    f2 = gl.reshape(t2, [32, 64])
    L: gl.constexpr = f0.type.layout
    n = gl.arange(0, 64, gl.SliceLayout(0, L))[None, :] + gl.zeros([32, 64], gl.int32, L)
    y = gl.gather(f0, gl.maximum(n - 1, 0), 1) + f1 + gl.gather(f2, gl.minimum(n + 1, 63), 1)
    _store_cqu(Out, gl.reshape(y, [32, 4, 16]))


@gluon.jit
def probe_gather_raw(W, X, Out):
    """No key permutation: the accumulator's own column order (n = 8 m + 2 q + b), gather along it."""
    y = _conv_y(W, X)
    y = gl.reshape(y, [2, 4, 2, 8, 64])               # a, w, rb, lh, n
    y = gl.permute(y, [1, 3, 4, 0, 2])
    y = gl.reshape(y, [32, 64, 2, 2])
    ya, yb = gl.split(y)
    t0, t2 = gl.split(ya)
    t1, t3 = gl.split(yb)
    L: gl.constexpr = t0.type.layout
    n = gl.arange(0, 64, gl.SliceLayout(0, L))[None, :] + gl.zeros([32, 64], gl.int32, L)
    out = gl.gather(t0, gl.maximum(n - 1, 0), 1) + t1 + gl.gather(t2, gl.minimum(n + 1, 63), 1)
    c = gl.arange(0, 32, gl.SliceLayout(1, L))
    gl.store(Out + c[:, None] * 64 + n, out)


@gluon.jit
def _halves(x):
    """Split the last axis (size 2 s) into its even and odd entries: (x[..., 0::2], x[..., 1::2])."""
    s: gl.constexpr = x.shape[2] // 2
    return gl.split(gl.reshape(x, [x.shape[0], x.shape[1], s, 2]))


@gluon.jit
def _unpack16(x):
    """[C, Q, 16] -> a 16-tuple of [C, Q] tensors, entry u = x[:, :, u] (renames only)."""
    e, o = _halves(x)                     # u0
    e0, e1 = _halves(e)
    o0, o1 = _halves(o)                   # u1
    e00, e01 = _halves(e0)
    e10, e11 = _halves(e1)
    o00, o01 = _halves(o0)
    o10, o11 = _halves(o1)                # u2
    a0, a8 = gl.split(e00)
    a4, a12 = gl.split(e01)
    a2, a10 = gl.split(e10)
    a6, a14 = gl.split(e11)
    a1, a9 = gl.split(o00)
    a5, a13 = gl.split(o01)
    a3, a11 = gl.split(o10)
    a7, a15 = gl.split(o11)
    return (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15)


@gluon.jit
def _j(a, b):
    """Inverse of _halves: interleave a (even) and b (odd) along the last axis."""
    x = gl.join(a, b)
    return gl.reshape(x, [x.shape[0], x.shape[1], x.shape[2] * 2])


@gluon.jit
def _pack16(p):
    """Inverse of _unpack16."""
    e00 = gl.join(p[0], p[8])
    e01 = gl.join(p[4], p[12])
    e10 = gl.join(p[2], p[10])
    e11 = gl.join(p[6], p[14])
    o00 = gl.join(p[1], p[9])
    o01 = gl.join(p[5], p[13])
    o10 = gl.join(p[3], p[11])
    o11 = gl.join(p[7], p[15])
    return _j(_j(_j(e00, e01), _j(e10, e11)), _j(_j(o00, o01), _j(o10, o11)))


@gluon.jit
def _lane_shift(v, s: gl.constexpr):
    """v [C, 4] with the 4-axis on lanes: out[:, q] = v[:, (q + s) % 4] (one shuffle)."""
    L: gl.constexpr = v.type.layout
    q = gl.arange(0, 4, gl.SliceLayout(0, L))[None, :] + gl.zeros(v.shape, gl.int32, L)
    return gl.gather(v, (q + s + 4) % 4, 1)


@gluon.jit
def probe_split(W, X, Out):
    """Shift by renaming split pieces; only the run edges move between lanes."""
    t0, t1, t2, t3 = _taps(_conv_y(W, X))
    a = _unpack16(t0)
    b = _unpack16(t1)
    c = _unpack16(t2)
    l_edge = _lane_shift(a[15], -1)
    r_edge = _lane_shift(c[0], 1)
    y = (l_edge + b[0] + c[1],
         a[0] + b[1] + c[2], a[1] + b[2] + c[3], a[2] + b[3] + c[4], a[3] + b[4] + c[5],
         a[4] + b[5] + c[6], a[5] + b[6] + c[7], a[6] + b[7] + c[8], a[7] + b[8] + c[9],
         a[8] + b[9] + c[10], a[9] + b[10] + c[11], a[10] + b[11] + c[12], a[11] + b[12] + c[13],
         a[12] + b[13] + c[14], a[13] + b[14] + c[15],
         a[14] + b[15] + r_edge)
    _store_cqu(Out, _pack16(y))


@gluon.jit
def probe_smem_offset(W, X, Out):
    """Shared-memory round trip, reading a sub-view at key offset 1 (the plan says this is refused)."""
    t0, t1, t2, t3 = _taps(_conv_y(W, X))
    f0 = gl.reshape(t0, [32, 64])
    sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    buf = gl.allocate_shared_memory(gl.float32, [32, 128], sl)
    buf.slice(0, 64, dim=1).store(f0)
    y = buf.slice(1, 64, dim=1).load(f0.type.layout)
    _store_cqu(Out, gl.reshape(y, [32, 4, 16]))


# ---- register-A probes (K_C's weight gradients, notes/kernels.md "Issue 45 step 7"): a conv accumulator,
# shifted along keys per tap, stacked on M and fed to a wgmma as its register A operand (no shared memory) ----
@gluon.jit
def _shift1(t, s: gl.constexpr):
    """[32, 4, 16] tap tile (key 16 q + u) -> out[key] = t[key - s], s = +-1: renames and one lane shuffle
    for the run edges (the wrapped keys are the tile's halo)."""
    a = _unpack16(t)
    if s == 1:
        y = (_lane_shift(a[15], -1), a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11],
             a[12], a[13], a[14])
    else:
        y = (a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15],
             _lane_shift(a[0], 1))
    return _pack16(y)


@gluon.jit
def _untaps(t0, t1, t2, t3):
    """The inverse of _taps: four [32, 4, 16] tap tiles (one layout) back to a [128, 64] accumulator."""
    y = gl.join(gl.join(t0, t2), gl.join(t1, t3))      # [32, 4, 16, 2 (a), 2 (rb)]
    y = gl.reshape(y, [4, 8, 4, 8, 2, 2, 2])            # w, lh, q, m, b, a, rb
    y = gl.permute(y, [5, 0, 6, 1, 3, 2, 4])            # a, w, rb, lh, m, q, b
    return gl.reshape(y, [128, 64])


@gluon.jit
def _rs_wgmma(stack, X, Out):
    """acc [128, 16] = stack [128, 64 keys] (registers, fp16 A operand) x X read as [64 keys, 16] (smem)."""
    ACC: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
    blk: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    r = gl.arange(0, 64, gl.SliceLayout(1, blk))
    c = gl.arange(0, 16, gl.SliceLayout(0, blk))
    xt = gl.allocate_shared_memory(gl.float16, [64, 16], gl.NVMMASharedLayout.get_default_for([64, 16], gl.float16),
                                   gl.load(X + r[:, None] * 16 + c[None, :]))
    fence_async_shared()
    a = gl.convert_layout(stack.to(gl.float16), gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2))
    acc = warpgroup_mma(a, xt, gl.zeros([128, 16], gl.float32, ACC))
    ro = gl.arange(0, 128, gl.SliceLayout(1, ACC))
    gl.store(Out + ro[:, None] * 16 + gl.arange(0, 16, gl.SliceLayout(0, ACC))[None, :], acc)


@gluon.jit
def probe_rs_acc(W, X, Out):
    """The accumulator itself as the A operand (FlashAttention's P-as-A)."""
    _rs_wgmma(_conv_y(W, X), X, Out)


@gluon.jit
def probe_rs_shifted(W, X, Out):
    """dW1's A operand: one [32, 64] map (tap 1 of the accumulator standing in for dY) shifted by +1, 0, -1
    keys into tap blocks 0-2, block 3 zero."""
    t0, t1, t2, t3 = _taps(_conv_y(W, X))
    L: gl.constexpr = t1.type.layout
    _rs_wgmma(_untaps(gl.convert_layout(_shift1(t1, 1), L), t1, gl.convert_layout(_shift1(t1, -1), L), t1 * 0.0),
              X, Out)


PROBE_SIG = {"W": "*fp16", "X": "*fp16", "Out": "*fp32"}
PROBES = ["probe_split", "probe_gather_u", "probe_gather_flat", "probe_gather_raw", "probe_smem_offset",
          "probe_rs_acc", "probe_rs_shifted"]


def fwd_signature(fn) -> dict:
    import inspect
    sig = {}
    for name in inspect.signature(fn.fn).parameters:
        if name in ("Q", "K", "V", "O"):
            sig[name] = "*bf16"
        elif name in ("W1A", "W2A"):
            sig[name] = "*fp16"
        elif name in ("T1", "K0", "T2", "LSE"):
            sig[name] = "*fp32"
        elif name == "scale":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--sass", default=None, help="write the forward's SASS here")
    ap.add_argument("--probes", action="store_true", help="compile the shift probes instead")
    ap.add_argument("--module", default=None, help="compile the forward of this copy of gluon.py instead (a variant)")
    a = ap.parse_args()
    out = {"triton": triton.__version__}
    if a.probes:
        for name in PROBES:
            try:
                out[name] = compile_gluon(globals()[name], PROBE_SIG, {}, 4)
            except Exception as e:  # a refused construct is a result too
                msg = [ln for ln in str(e).splitlines() if "error" in ln.lower()]
                out[name] = {"refused": (msg or [repr(e)])[-1].strip()}
    else:
        if a.module:
            import importlib.util
            spec = importlib.util.spec_from_file_location(Path(a.module).stem, a.module)
            G = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = G
            spec.loader.exec_module(G)
        else:
            from lenx.ops.dape_v2 import gluon as G
        fn = G._kernels()["fwd"]
        consts = {"H": a.heads, "D": a.hidden, "KS": a.k, "BM": G.BM, "num_warps": G.NUM_WARPS}
        out["shape"] = {"heads": a.heads, "hidden": a.hidden, "k": a.k, "BM": G.BM, "head_dim": 64}
        sig = fwd_signature(fn)
        # the launch's specialisation for contiguous [B, H, T, 64] q, k, v, o: every pointer and stride
        # but the table lengths is a multiple of 16
        div = [n for n, t in sig.items() if t.startswith("*") or n.startswith(("sq", "sk", "sv", "so"))]
        out["fwd"] = compile_gluon(fn, sig, consts, G.NUM_WARPS, sass_path=a.sass, divisible=div)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
