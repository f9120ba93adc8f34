"""Compile the biased-softmax kernels (forward, dq, dK/dV; lenx.ops.biased_softmax) for sm_90a without
a GPU and print registers, spills and shared memory per kernel, with and without a query
temperature's factor per row (HAS_QF; the dq kernel then gives the factor its gradient too, as
SSMax's needs). The 125m shape: bf16, d 64, the Kerple band (fp16 residuals,
the transposed band for the key-owner kernel) and the Kerple parameters' sums; --fox for FoX's
per-token bias, --window and/or --documents for the masked variants.

Usage (repository root, any machine with triton): PYTHONPATH=src python3 scripts/tune/compile_biased.py
"""

import argparse
import inspect
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import offline_compile as oc  # noqa: E402
from lenx.ops._launch import dot_precision  # noqa: E402
from lenx.ops.biased_softmax import backward, triton as bt  # noqa: E402
from lenx.ops.biased_softmax.band import BAND_PAD, BAND_W, tile_config  # noqa: E402

BF16 = ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV")
FLOATS = ("qk_scale", "sm_scale")


def signature(fn, consts: dict, fp16_band: bool) -> dict:
    """Triton's signature: constexprs, bf16 q/k/v and their gradients, an fp16 band with fp16
    residuals, int32 document spans, other capitalised names fp32 pointers; the scales fp32, the
    rest (T, strides, the window, n_tail) int32."""
    sig = {}
    for name in inspect.signature(fn.fn).parameters:
        if name in consts:
            sig[name] = "constexpr"
        elif name in ("DOCS", "LASTS"):
            sig[name] = "*i32"
        elif name == "BAND":
            sig[name] = "*fp16" if fp16_band else "*fp32"
        elif name[0].isupper() and name not in ("T", "WIN"):
            sig[name] = "*bf16" if name in BF16 else "*fp32"
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
    return sig


def compile_kernel(fn, consts: dict, tiles, fp16_band: bool) -> dict:
    BM, BN, nw, ns = tiles
    consts = {**consts, "BM": BM, "BN": BN}
    names = list(inspect.signature(fn.fn).parameters)
    sig = signature(fn, consts, fp16_band)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n] not in ("constexpr", "fp32")}
    src = oc.ASTSource(fn, sig, constexprs=consts, attrs=attrs)
    k = oc.triton.compile(src, target=oc.GPUTarget("cuda", 90, 32), options={"num_warps": nw, "num_stages": ns})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(k.asm["cubin"])
        log = subprocess.run([str(oc.BIN / "cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True,
                             check=True).stdout
    stack = re.search(r"STACK:(\d+)", log)
    return {"registers": int(re.search(r"REG:(\d+)", log)[1]), "stack_bytes": int(stack[1]) if stack else 0,
            "shared_bytes": k.metadata.shared}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--fox", action="store_true", help="FoX's per-token bias instead of the Kerple band")
    ap.add_argument("--window", action="store_true", help="the variant with a sliding window")
    ap.add_argument("--documents", action="store_true", help="the variant with document ids")
    a = ap.parse_args()
    cfg = tile_config(torch.bfloat16, a.head_dim)
    res16 = not a.fox and cfg["band"][0] == "fp16"
    common = dict(H=a.heads, HAS_BIAS=True, ROWS=a.fox, DH=a.head_dim, W=BAND_W, PAD=BAND_PAD, RES16=res16,
                  PREC=dot_precision(torch.bfloat16), HAS_W=a.window, HAS_SEG=a.documents)
    out = {"shape": vars(a), "tiles": {k: cfg[k] for k in ("fwd", "dkdv", "dq")}, "triton": oc.triton.__version__}
    for qf in (False, True):
        tag = "with factor" if qf else "without"
        out[f"fwd {tag}"] = compile_kernel(bt._bias_fwd, {**common, "HAS_QF": qf}, cfg["fwd"], res16)
        dq = {**common, "HAS_QF": qf, "NEED_DF": qf, "NEED_DTAB": False, "KERPLE": 0 if a.fox else 1, "TAIL": False,
              "HW": True}
        out[f"dq {tag}"] = compile_kernel(backward._bias_bwd_dq, dq, cfg["dq"], res16)
        dkdv = {**common, "HAS_QF": qf, "BAND_T": not a.fox and cfg["dkdv_band"][0] == "T"}
        out[f"dkdv {tag}"] = compile_kernel(backward._bias_bwd_dkdv, dkdv, cfg["dkdv"], res16)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
