"""Compile the DAPE V2 forward chain (src/lenx/ops/dape_v2/chain.py) offline for sm_90a and report
registers, spill bytes, shared memory, a SASS census, and the spill instructions (LDL / STL) inside
the window loop (the kernel's longest loop: every key window's QK, conv rows and softmax); exit 1
when there are any there. Needs triton 3.6 (the Gluon API the kernel is written against); no GPU.

Usage (repository root):
    PYTHONPATH=src /path/to/triton-3.6/python scripts/tune/compile_chain.py [--heads 12] [--k 3] [--ring 4] [--sass F]
    PYTHONPATH=src /path/to/triton-3.6/python scripts/tune/compile_chain.py --ws [--k 1]   # chain_ws.py
"""

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import gluon_compile as gc  # noqa: E402
import ws_sass_regions as wr  # noqa: E402


def loop_spills(sass: str) -> dict:
    """LDL / STL counts in the longest backward branch's body of the SASS (the window loop)."""
    insts = [(int(m[1], 16), m[2]) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    loops = [(int(t[1], 16), addr) for addr, text in insts if "BRA" in text
             for t in [re.search(r"0x([0-9a-f]+)", text)] if t and int(t[1], 16) < addr]
    if not loops:
        return {"loop_instructions": 0, "LDL": 0, "STL": 0}
    lo, hi = max(loops, key=lambda r: r[1] - r[0])
    body = [text for addr, text in insts if lo <= addr <= hi]
    ops = [re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body]
    return {"loop_instructions": len(body), "LDL": ops.count("LDL"), "STL": ops.count("STL")}


def compile_chain(heads: int = 12, hidden: int = 32, k: int = 3, sass_path=None, ring=None) -> dict:
    from lenx.ops.dape_v2 import chain as C

    fn = C.kernel()
    sig = gc.fwd_signature(fn)
    div = [n for n, t in sig.items() if t.startswith("*") or n.startswith(("sq", "sk", "sv", "so"))]
    ring = 2 if ring is None else ring
    consts = {"H": heads, "D": hidden, "KS": k, "BM": C.BM, "RING": ring, "num_warps": C.NUM_WARPS}
    tmp = sass_path or "/tmp/lenx_chain.sass"
    out = gc.compile_gluon(fn, sig, consts, C.NUM_WARPS, sass_path=tmp, divisible=div)
    out["window_loop"] = loop_spills(Path(tmp).read_text())
    return out


def partition_spills(sass: str) -> list:
    """[register request, LDL + STL, HGMMA] per region of the SASS, in order: a region runs from one
    USETMAXREG to the next; the first (request 0) is the code before any, the kernel's prologue. The
    conv partition is the region with the HGMMAs."""
    out = [[0, 0, 0]]
    for line in sass.splitlines():
        m = re.search(r"USETMAXREG\.\w+\.CTAPOOL\s+(?:UP\d+,\s+)?(0x[0-9a-f]+)", line)
        if m:
            out.append([int(m[1], 16), 0, 0])
        elif re.search(r"\s(LDL|STL)[\s.]", line):
            out[-1][1] += 1
        elif re.search(r"\sHGMMA\.", line):
            out[-1][2] += 1
    return out


def compile_chain_ws(heads: int = 12, hidden: int = 32, k: int = 3, sass_path=None) -> dict:
    """chain_ws.py's kernel: the census, the spills per partition (conv: the 8-warp default) and
    ws_sass_regions' census of each partition and its loops ("regions")."""
    from lenx.ops.dape_v2 import chain_ws as W

    fn = W.kernel()
    sig = gc.fwd_signature(fn)
    div = [n for n, t in sig.items() if t.startswith("*") or n.startswith(("sq", "sk", "sv", "so"))]
    consts = {"H": heads, "D": hidden, "KS": k, "BM": W.BM, "HEAD_REGS": W.HEAD_REGS, "num_warps": W.NUM_WARPS}
    tmp = sass_path or "/tmp/lenx_chain_ws.sass"
    out = gc.compile_gluon(fn, sig, consts, W.NUM_WARPS, sass_path=tmp, divisible=div)
    out["partitions"] = partition_spills(Path(tmp).read_text())
    out["regions"] = wr.analyse(Path(tmp).read_text())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--ring", type=int, default=None, help="K/V ring slots (chain.ring_sizes; default 2)")
    ap.add_argument("--sass", default=None, help="write the SASS here")
    ap.add_argument("--ws", action="store_true", help="the warp-specialised chain (chain_ws.py): spills per partition")
    a = ap.parse_args()
    import triton

    if a.ws:
        res = compile_chain_ws(a.heads, a.hidden, a.k, a.sass)
        res.pop("regions")   # ws_sass_regions.py prints them readably from the --sass file
        print(json.dumps({"triton": triton.__version__, "chain_ws": res}))
        return

    res = {"triton": triton.__version__, "shape": {"heads": a.heads, "hidden": a.hidden, "k": a.k, "ring": a.ring},
           "chain": compile_chain(a.heads, a.hidden, a.k, a.sass, a.ring)}
    print(json.dumps(res, indent=1))
    loop = res["chain"]["window_loop"]
    if loop["LDL"] or loop["STL"]:
        print(f"error: {loop['LDL']} LDL / {loop['STL']} STL in the window loop", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
