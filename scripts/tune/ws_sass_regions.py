"""Census of a warp-specialised kernel's SASS by partition and loop: the code between two USETMAXREG
instructions is one region (a partition's body: the prologue, each worker, the default partition),
and inside a region every backward branch closes a loop. For each region and loop: instructions,
the register request, and the counts of the operations that set its time (tensor-core ops, shared
and global memory, barriers, mbarrier waits, spills, special functions); last, the bytes of each
region's outermost loop and their sum (the code the partitions run at once).

Usage (repository root; the SASS from compile_chain.py --ws --sass F, or cuobjdump -sass):
    python scripts/tune/ws_sass_regions.py F.sass [--json out.json]
"""

import argparse
import json
import re
from collections import Counter

OPS = ["HGMMA", "HMMA", "LDSM", "LDS", "STS", "LDG", "LDGSTS", "LDGDEPBAR", "DEPBAR", "STG", "LDL", "STL",
       "BAR", "SYNCS", "SHFL", "MUFU", "FADD", "FMUL", "FFMA", "FMNMX", "F2FP", "SEL", "PRMT", "IMAD", "BRA"]


def instructions(sass: str) -> list:
    """(address, opcode, text) per instruction; the opcode without predicate or modifiers."""
    out = []
    for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass):
        text = m[2]
        op = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]
        out.append((int(m[1], 16), op, text))
    return out


def regions(insts: list) -> list:
    """[start, end) indices of the code between USETMAXREG instructions, with the request after it."""
    cuts = [(i, t) for i, (_, op, t) in enumerate(insts) if op == "USETMAXREG"]
    bounds = [(0, 0)] + [(i, int(re.search(r"(0x[0-9a-f]+)\s*$", t)[1], 16)) for i, t in cuts]
    return [(a, b[0] if k + 1 < len(bounds) else len(insts), req)
            for k, ((a, req), b) in enumerate(zip(bounds, bounds[1:] + [(len(insts), 0)]))]


def census(body: list) -> dict:
    c = Counter(op for _, op, _ in body)
    out = {"instructions": len(body)}
    out.update({op: c[op] for op in OPS if c[op]})
    bars = Counter(re.sub(r"\s+", " ", t.split("BAR.")[1]) for _, op, t in body if op == "BAR")
    if bars:
        out["barriers"] = dict(bars)
    return out


def loops(insts: list, a: int, b: int) -> list:
    """Loops of region [a, b): (first, last) instruction indices of each backward branch's body."""
    index = {addr: i for i, (addr, _, _) in enumerate(insts)}
    out = []
    for i in range(a, b):
        addr, op, text = insts[i]
        t = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", text) if op == "BRA" else None
        if t and int(t[1], 16) < addr and int(t[1], 16) in index and index[int(t[1], 16)] >= a:
            out.append((index[int(t[1], 16)], i))
    return sorted(set(out))


def analyse(sass: str) -> list:
    insts = instructions(sass)
    res = []
    for a, b, req in regions(insts):
        body = insts[a:b]
        r = {"registers": req, "start": f"{insts[a][0]:#x}" if a < len(insts) else None, **census(body)}
        r["loops"] = [{"from": f"{insts[i][0]:#x}", "to": f"{insts[j][0]:#x}", **census(insts[i:j + 1])}
                      for i, j in loops(insts, a, b) if j - i > 20]
        res.append(r)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass")
    ap.add_argument("--json", default=None, help="write the census here as well")
    a = ap.parse_args()
    res = analyse(open(a.sass).read())
    for r in res:
        print(json.dumps({k: v for k, v in r.items() if k != "loops"}))
        for lp in r["loops"]:
            print("   loop", json.dumps(lp))
    # each region's outermost loop is what its warps run per key window: its code bytes (16 per
    # instruction) are what the SM's instruction caches must hold at once for the partitions to overlap
    hot = [max((lp["instructions"] for lp in r["loops"]), default=0) * 16 for r in res]
    print(json.dumps({"outer_loop_bytes": [h for h in hot if h], "hot_code_bytes": sum(hot)}))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
