"""Hardware approximations for the Triton kernels. tl.log2 and a / b compile to multi-instruction
IEEE routines (tl.log2 to a ~25-instruction polynomial, found in the SASS: notes/kernels.md);
the PTX approximations are one MUFU op each. The interpreter (the CPU tests) cannot
run PTX, so HW=False takes the plain forms: the kernels pass HW = their inputs are on CUDA."""

import triton
import triton.language as tl


@triton.jit
def log2(x, HW: tl.constexpr):
    """log2(x), absolute error ~2^-22 for x in [0.5, 2] (relative elsewhere)."""
    if HW:
        return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.log2(x)


@triton.jit
def rcp(x, HW: tl.constexpr):
    """1 / x, relative error ~2^-23."""
    if HW:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return 1.0 / x
