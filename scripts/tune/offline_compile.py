"""Compile the DAPE V2 kernels for sm_90a without a GPU and print registers, spills and shared
memory per kernel (cuobjdump -res-usage from triton's bundled toolchain; STACK is the local memory spills use). The headline shape: bf16, H 12,
d 64, D 32, k 3 (override with --k, --hidden, --heads, --head-dim, --no-bias; --window and/or
--documents compile the masked variants; --fp32 the fp32 inputs' kernels).

Usage (repository root, any machine with triton): PYTHONPATH=src python3 scripts/tune/offline_compile.py
"""

import argparse
import inspect
import json
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lenx.ops._launch import dot_precision, pow2
from lenx.ops.dape_v2 import triton as dk

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


BF16 = ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV")


def signature(fn, consts: dict, bf16=BF16) -> dict:
    """Triton's signature of a kernel: constexprs as such, capitalised names (but T and WIN) pointers
    (to bf16 for the names in `bf16`, int32 for the document spans, else fp32)."""
    sig = {}
    for name in inspect.signature(fn.fn).parameters:
        if name in consts:
            sig[name] = "constexpr"
        elif name in ("DOCS", "LASTS"):
            sig[name] = "*i32"
        elif name[0].isupper() and name not in ("T", "WIN"):  # T is the length, WIN the window
            sig[name] = "*bf16" if name in bf16 else "*fp32"
        elif name in ("scale", "qk_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def aligned(fn, consts: dict) -> dict:
    """The JIT's specialisation at the training shapes: every pointer 16-byte aligned and every
    integer (T, strides) a multiple of 16; without it the compiler cannot vectorise loads."""
    names = list(inspect.signature(fn.fn).parameters)
    sig = signature(fn, consts)
    return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names) if sig[name] not in ("constexpr", "fp32")}


def compile_one(fn, consts, num_warps, num_stages, bf16=BF16):
    src = ASTSource(fn, signature(fn, consts, bf16), constexprs=dict(consts), attrs=aligned(fn, consts))
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(k.asm["cubin"])
        log = subprocess.run([str(BIN / "cuobjdump"), "-res-usage", str(cubin)],
                             capture_output=True, text=True, check=True).stdout
    regs = re.search(r"REG:(\d+)", log)
    stack = re.search(r"STACK:(\d+)", log)
    return {"registers": int(regs[1]), "stack_bytes": int(stack[1]) if stack else 0,
            "shared_bytes": k.metadata.shared, "wgmma": "wgmma" in k.asm["ptx"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--no-bias", action="store_true")
    ap.add_argument("--window", action="store_true", help="the variant with a sliding window")
    ap.add_argument("--documents", action="store_true", help="the variant with document ids")
    ap.add_argument("--fp32", action="store_true", help="fp32 inputs (exact fp32 products) instead of bf16")
    a = ap.parse_args()
    sh = dk._shapes(a.heads, a.hidden, a.k, not a.no_bias)
    cfg = dk.tile_config(a.k, sh["DP"], "bf16")
    BM, BNW, nw, ns = cfg["tiles"]
    prec = dot_precision(torch.float32 if a.fp32 else torch.bfloat16)
    bf16 = () if a.fp32 else BF16
    common = dict(DH=a.head_dim, HAS_BIAS=not a.no_bias, BM=BM, BNW=BNW, PREC=prec, CPREC="ieee" if a.fp32 else "bf16",
                  HAS_W=a.window, HAS_SEG=a.documents, **sh)
    out = {"shape": vars(a), "tiles": cfg["tiles"], "triton": triton.__version__}
    out["fwd"] = compile_one(dk._dape_fwd, common, nw, ns, bf16)
    out["bwd_dq"] = compile_one(dk._dape_bwd_dq, {**common, "E": pow2(BM + BNW - 1)}, nw, ns, bf16)
    split = sh["HP"] * BNW * a.head_dim > dk.DKDV_ONE_PASS_MAX
    passes = [(False, True), (True, False)] if split else [(True, True)]
    for want_dk, want_dv in passes:
        name = "bwd_dkdv" if not split else ("bwd_dk" if want_dk else "bwd_dv")
        out[name] = compile_one(dk._dape_bwd_dkdv, {**common, "WANT_DK": want_dk, "WANT_DV": want_dv,
                                                     "SPLIT": split}, nw, ns, bf16)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
