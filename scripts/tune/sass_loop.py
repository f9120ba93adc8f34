"""Compile one kernel of the skewed DAPE V2 module (or a copy of it) offline for sm_90a and count its
SASS instructions by kind, in the whole kernel and in its longest loop (the per-tile body): global and
shared loads/stores, barriers, shuffles, tensor-core instructions. A static count: what one iteration
of the row loop issues, the cheapest look at a change before device time.

Usage (repository root; triton 3.6 as on the device, torch from lenx's venv):
  PYTHONPATH=src:scripts/tune:/work/venv-t36/lib/python3.11/site-packages:/work/main/.venv/lib/python3.11/site-packages \\
      /work/venv-t36/bin/python scripts/tune/sass_loop.py [--file COPY.py] [--kernel _conv_dy] [--tiles 8,16,8]
"""

import argparse
import collections
import importlib.util
from pathlib import Path
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import offline_compile as oc
from compile_skewed import BF16

KINDS = ("LDG", "STG", "LDS", "STS", "BAR", "SHFL", "HMMA", "HGMMA", "WARPGROUP", "LDL", "STL")


def load(path: Path):
    """The module at path with its package-relative imports made absolute."""
    text = path.read_text().replace("from .._launch import", "from lenx.ops._launch import")
    text = text.replace("from .reference import", "from lenx.ops.dape_v2.reference import")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location("skewed_copy", f.name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def counts(lines):
    return collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", type=Path, default=Path("src/lenx/ops/dape_v2/skewed.py"))
    ap.add_argument("--kernel", default="_conv_dy")
    ap.add_argument("--tiles", default="8,16,8", help="BM,BN,warps")
    ap.add_argument("--stages", type=int, default=1)
    ap.add_argument("--all-loops", action="store_true", help="also count every loop's body")
    a = ap.parse_args()
    BM, BN, warps = (int(x) for x in a.tiles.split(","))
    fn = getattr(load(a.file), a.kernel)
    consts = dict(H=12, HP=16, KS=3, KSP=4, DP=32, KP=64, KZ=128, DH=64, CDT=tl.bfloat16, PREC="tf32", BM=BM, BN=BN)
    consts = {k: v for k, v in consts.items() if k in fn.fn.__code__.co_varnames}
    kern = triton.compile(ASTSource(fn, oc.signature(fn, consts, BF16), constexprs=consts, attrs=oc.aligned(fn, consts)),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": a.stages})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kern.asm["cubin"])
        usage = subprocess.run([str(oc.BIN / "cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
        sass = subprocess.run([str(oc.BIN / "cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True).stdout
    insts = [(int(m[1], 16), m[2]) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    loops = [(int(t[1], 16), addr) for addr, text in insts if "BRA" in text
             for t in [re.search(r"0x([0-9a-f]+)", text)] if t and int(t[1], 16) < addr]
    lo, hi = max(loops, key=lambda r: r[1] - r[0]) if loops else (0, -1)
    body = [t for addr, t in insts if lo <= addr <= hi]
    whole, loop = counts(t for _, t in insts), counts(body)
    regs = re.search(r"REG:(\d+)", usage)[1]
    stack = (re.search(r"STACK:(\d+)", usage) or [0, 0])[1]
    print(f"{a.kernel} tiles {a.tiles}: registers {regs}, stack {stack} B")
    print(f"  kernel {len(insts)} instructions", {k: whole[k] for k in KINDS if whole[k]})
    print(f"  loop   {len(body)} instructions", {k: loop[k] for k in KINDS if loop[k]})
    memory = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for t in body
                                 if re.search(r"\b(LDG|STG|LDS|STS)", t))
    print("  loop's memory instructions by width", dict(sorted(memory.items())))
    if a.all_loops:  # every backward branch's body, e.g. a flash kernel's masked and unmasked loops
        for lo_, hi_ in sorted(loops):
            part = [t for addr, t in insts if lo_ <= addr <= hi_]
            widths = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for t in part
                                         if re.search(r"\b(LDG|STG|LDS|STS)", t))
            print(f"  loop {lo_:#x}-{hi_:#x}: {len(part)} instructions", dict(sorted(widths.items())))


if __name__ == "__main__":
    main()
