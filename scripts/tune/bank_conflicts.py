"""Shared-memory bank conflicts of chain_ws.py's per-window accesses, from Gluon's own model
(`gl.bank_conflicts`: the excess wavefronts per wavefront of the ld.shared / st.shared instructions a
register layout gives against a shared layout; 0 is conflict-free). Each buffer with the layout the
kernel uses and, for the ones changed against conflicts, the layout before. ldmatrix / stmatrix are
priced as the equivalent vector accesses (rows of 16 bytes), which is how their 8x8 matrices fall
on the banks. Compiles small kernels offline (no GPU); the numbers back the table in notes/kernels.md,
"Issue 45 step 6".

Usage (repository root; a triton with Gluon's bank_conflicts, 3.6 or newer):
    PYTHONPATH=src python scripts/tune/bank_conflicts.py
"""

import contextlib
import io
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from lenx.ops.dape_v2 import chain_ws as W  # noqa: E402
from lenx.ops.dape_v2.gluon import _tapsum, _to_rows  # noqa: E402

PLAIN2 = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
PLAIN3 = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
PLAIN4 = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0]))


@gluon.jit
def _conv_side(P):
    """8 warps: the conv partition's f into Fp, and the L update's row reads of Fp and X."""
    ACC_Y: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 64, 16])
    f = _to_rows(_tapsum(gl.zeros([128, 128], gl.float32, ACC_Y), 3)).to(gl.float16)
    fp = gl.allocate_shared_memory(gl.float16, [64, 64], W.FP_SWIZZLE)
    fp0 = gl.allocate_shared_memory(gl.float16, [64, 64], PLAIN2)
    gl.static_print("@fp_store", gl.bank_conflicts(f.type, fp.type))
    gl.static_print("@fp_store_unswizzled", gl.bank_conflicts(f.type, fp0.type))
    r = gl.zeros([16, 64], gl.float16, gl.BlockedLayout([1, 4], [2, 16], [8, 1], [1, 0]))
    row = gl.allocate_shared_memory(gl.float16, [16, 64], W.FP_SWIZZLE)
    row0 = gl.allocate_shared_memory(gl.float16, [16, 64], PLAIN2)
    gl.static_print("@fp_row_read", gl.bank_conflicts(r.type, row.type))
    gl.static_print("@x_row_read", gl.bank_conflicts(r.type, row0.type))


@gluon.jit
def _head_side(P):
    """4 warps (one a head): O's read-modify-write in PV, S / L in X by the accumulator layout."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1], instr_shape=[1, 16, 8])
    blk = W._to_blocks(gl.zeros([4, 16, 32], gl.float32, MMA))
    os_ = gl.allocate_shared_memory(gl.float32, [4, 2, 16, 16], PLAIN4)
    gl.static_print("@os_rmw", gl.bank_conflicts(blk.type, os_.type))
    o = gl.zeros([4, 16, 32], gl.float32, MMA)
    os0 = gl.allocate_shared_memory(gl.float32, [4, 16, 32], PLAIN3)   # rows of 256 B: the bank pattern of [.., 64]
    gl.static_print("@os_rmw_rows", gl.bank_conflicts(o.type, os0.type))
    x = gl.zeros([4, 16, 64], gl.float16, MMA)
    x0 = gl.allocate_shared_memory(gl.float16, [4, 16, 64], PLAIN3)   # a row every 128 B: X's bank pattern (2 KB)
    gl.static_print("@x_head_view", gl.bank_conflicts(x.type, x0.type))


def conflicts() -> dict:
    """{access: excess wavefronts per wavefront} for chain_ws's accesses (see the module docstring)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for fn, warps in ((_conv_side, 8), (_head_side, 4)):
            src = GluonASTSource(fn, {"P": "*fp32"}, constexprs={})
            src.make_ir(GPUTarget("cuda", 90, 32), _options(warps), {}, {}, _context())
    return {m[1]: int(m[2]) for m in re.finditer(r"@(\w+)\s+(\d+)", out.getvalue())}


def _options(warps):
    from triton.backends.nvidia.compiler import CUDABackend
    return CUDABackend(GPUTarget("cuda", 90, 32)).parse_options({"num_warps": warps})


def _context():
    from triton._C.libtriton import ir
    from triton.backends.nvidia.compiler import CUDABackend
    ctx = ir.context()
    ir.load_dialects(ctx)
    CUDABackend(GPUTarget("cuda", 90, 32)).load_dialects(ctx)
    return ctx


if __name__ == "__main__":
    print(json.dumps({"triton": triton.__version__, "excess_wavefronts_per_wavefront": conflicts()}, indent=1))
