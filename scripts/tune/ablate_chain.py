"""Where the DAPE V2 forward chain's time goes, stage by stage, without hardware counters: copies of
src/lenx/ops/dape_v2/chain.py with one stage (or one latency source) left out, made by source edits
into a temporary module, timed back to back against the unedited copy. The edited kernels' outputs are
wrong by design; only their times count. A copy of gluon.py's `_conv_rows` (the conv row loop the
chain imports) goes into every variant, so the conv stages can be edited too; "base" is chain.py's
kernel unchanged.

Two modes:
  --compile   no GPU, triton 3.6: each variant compiled for sm_90a; registers, spills, shared memory,
              and the instructions a warp issues per key window (the window loop with its row-pair
              loop run BM / 2 times), with the barriers, wgmmas and global loads among them.
  (default)   sm_90 GPU, triton 3.6: each variant's forward (B 1, H 12, d 64, D 32, k 3, Kerple,
              bf16, host tables prepared once) as back-to-back medians, and its time saved against base.

Usage (repository root):
    PYTHONPATH=src python3 scripts/tune/ablate_chain.py -o ablate_chain.json [--T 8192] [--ring 2] [--only "a;b"]
    PYTHONPATH=src /path/to/triton-3.6/python scripts/tune/ablate_chain.py --compile -o compile.json
"""

import argparse
import importlib.util
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHAIN = ROOT / "src" / "lenx" / "ops" / "dape_v2" / "chain.py"
GLUON = ROOT / "src" / "lenx" / "ops" / "dape_v2" / "gluon.py"

# anchors in chain.py (the step comments keep step 1's and step 3's head loops apart)
STEP1 = "            for h in gl.static_range(H):\n                _thread_barrier()   # the slot of item h + RING - 1 is free"
STEP3 = "            for h in gl.static_range(H):\n                t2 = t2n"
K_LOADS = """                _issue(ring, h + RING - 1, H, RING, K + b * skb, V + b * svb, k_off, v_off, k_keys, skh, svh, skt, T, STEP)"""
V_LOADS = """                _issue(ring, H + h + RING - 1, H, RING, K + b * skb, V + b * svb, k_off, v_off, k_keys, skh, svh, skt, T, STEP)"""
QK = "                sT = warpgroup_mma(kb, Qs.index(h).permute((1, 0)), gl.zeros([64, BM], gl.float32, ACC_S), use_acc=False)"
PV = "                o = warpgroup_mma(vb.permute((1, 0)), Pb, o)"
SF = "                sT = _load_T(Ss.index(h), like)\n                fT = _load_T(XF.slice(h, 1, dim=1), like)"
T2A = "            t2n = gl.load(t2_ptr, mask=valid, other=0.0)"
T2B = "                    t2n = gl.load(t2_ptr + (h + 1) * (2 * T - 1), mask=valid, other=0.0)"
MAX = """                Mx.index(h % 2).store(_warp_max(lg))
                _thread_barrier()
                m_new = gl.maximum(gl.maximum(m_old, gl.maximum(Mxr.index(4 * (h % 2)).load(SROW), Mxr.index(4 * (h % 2) + 1).load(SROW))),
                                   gl.maximum(Mxr.index(4 * (h % 2) + 2).load(SROW), Mxr.index(4 * (h % 2) + 3).load(SROW)))"""
OLOAD = "                o = Os.index(h).load(ACC_S) * alpha[None, :]"
# anchors in the copy of gluon.py's _conv_rows
PAIRS = "        for ip in range(BM // 2):"
CONV1 = "            y = _tapsum(warpgroup_mma(w1, Xb, gl.zeros([128, 128], gl.float32, ACC_Y), use_acc=False), KS)"
CONV2 = "            f = _tapsum(warpgroup_mma(w2, Zb, gl.zeros([128, 128], gl.float32, ACC_Y), use_acc=False), KS)"
EDGES = """            e1 = gl.load(T1 + cc2 * (2 * T - 1) + T - 1 + ne + q2 * 0, mask=(cc2 < D) & (ne < T), other=0.0)
            e2 = gl.load(T1 + cc2 * (2 * T - 1) + T + ne + q2 * 0, mask=(cc2 < D) & (ne + 1 < T), other=0.0)"""

NO_STEP1 = (STEP1, STEP1.replace("static_range(H)", "static_range(0)"))
NO_STEP2 = (PAIRS, PAIRS.replace("range(BM // 2)", "range(0)"))
NO_STEP3 = (STEP3, STEP3.replace("static_range(H)", "static_range(0)"))
# a run-time value (q0) keeps the compiler from folding the work after a removed wgmma away
FAKE_Y = "_tapsum(gl.full([128, 128], 1.0, gl.float32, ACC_Y) * q0, KS)"

# name -> list of (old, new) source edits
VARIANTS = {
    "base": [],
    "no step 1 (QK of every head)": [NO_STEP1],
    "no step 2 (conv rows)": [NO_STEP2],
    "no step 3 (softmax, PV)": [NO_STEP3],
    "step 1 only": [NO_STEP2, NO_STEP3],
    "step 2 only": [NO_STEP1, NO_STEP3],
    "step 3 only": [NO_STEP1, NO_STEP2],
    # only the items of the other step are issued: the tiles of this one are stale
    "no K loads (step 1 reads stale tiles)": [(K_LOADS, "                if h + RING - 1 >= H:\n    " + K_LOADS)],
    "no V loads (step 3 reads stale tiles)": [(V_LOADS, "                if h + RING - 1 >= H:\n    " + V_LOADS)],
    "no QK wgmma": [(QK, "                sT = like + q0")],
    "no PV wgmma": [(PV, "                o = o + 1.0")],
    "no conv1 wgmma (tap sum kept)": [(CONV1, "            y = " + FAKE_Y)],
    "no conv2 wgmma (tap sum kept)": [(CONV2, "            f = " + FAKE_Y)],
    "no t1 edge loads": [(EDGES, "            e1 = (cc2 + ne + q2 * 0).to(gl.float32)\n            e2 = e1")],
    "no S, f loads in step 3": [(SF, "                sT = (like + q0).to(gl.float16)\n                fT = sT")],
    "no t2 load": [(T2A, "            t2n = like + 0.0"), (T2B, "                    t2n = like + 0.0")],
    "no max exchange": [(MAX, "                m_new = m_old + 0.0")],
    "no O load": [(OLOAD, "                o = like * alpha[None, :]")],
}


def conv_rows_source() -> str:
    """gluon.py's `_conv_rows`, decorator included, as its text (4-space indented, like chain.py's kernels)."""
    text = GLUON.read_text()
    start = text.index("    @gluon.jit\n    def _conv_rows(")
    return text[start: text.index("    @gluon.jit\n", start + 10)]


def variant_source(name: str) -> str:
    """chain.py's text with a local copy of `_conv_rows` and the variant's edits; absolute imports."""
    text = CHAIN.read_text().replace("from .gluon import", "from lenx.ops.dape_v2.gluon import")
    hook = "    @gluon.jit\n    def _load1("
    extra = "    from lenx.ops.dape_v2.gluon import _conv1_input, _minus_k0, _next_row, _to_columns, _to_rows\n\n"
    if text.count(hook) != 1:
        raise SystemExit("error: chain.py changed: `_load1` not found once")
    text = text.replace(hook, extra + conv_rows_source() + hook)
    for old, new in VARIANTS[name]:
        if text.count(old) != 1:
            raise SystemExit(f"error: variant {name!r}: its edit anchor is found {text.count(old)} times "
                             "(chain.py or gluon.py changed)")
        text = text.replace(old, new)
    return text


def load_variant(name: str, tmp: Path):
    """The variant as a module (a file on disk: Gluon reads a kernel's source through inspect)."""
    path = tmp / f"chain_variant_{len(list(tmp.iterdir()))}.py"
    path.write_text(variant_source(name))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod


def window_census(sass: str, pairs: int) -> dict:
    """Instructions a warp issues in one key window after the first: the window loop (the longest
    backward branch) with its inner row-pair loop run `pairs` times. The first window's k0 copy of
    that loop is skipped then; it is the larger of two inner copies (k 3), so the smallest one is
    taken as the loop that runs."""
    insts = [(int(m[1], 16), m[2]) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    ops = {a: re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for a, t in insts}
    loops = [(int(t[1], 16), a) for a, text in insts if "BRA" in text
             for t in [re.search(r"0x([0-9a-f]+)", text)] if t and int(t[1], 16) < a]
    if not loops:
        return {}
    lo, hi = max(loops, key=lambda r: r[1] - r[0])
    inner = [r for r in loops if lo <= r[0] and r[1] < hi]

    def count(a0, a1, which=None):
        return sum(1 for a in ops if a0 <= a <= a1 and (which is None or ops[a] in which))

    out = {}
    for key, which in (("issued", None), ("BAR", ("BAR",)), ("HGMMA", ("HGMMA",)), ("LDG", ("LDG", "LDGSTS")),
                       ("LDS", ("LDS", "LDSM")), ("STS", ("STS", "STSM")), ("LDL/STL", ("LDL", "STL"))):
        n = count(lo, hi, which) - sum(count(a, b, which) for a, b in inner)
        if inner:
            a, b = min(inner, key=lambda r: r[1] - r[0])
            n += pairs * count(a, b, which)
        out[key] = n
    out["pair_loop"] = min((count(a, b) for a, b in inner), default=0)
    return out


def compile_variants(names, ring: int = 2, heads: int = 12, hidden: int = 32, k: int = 3) -> list:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gluon_compile as gc

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            mod = load_variant(name, Path(tmp))
            fn = mod.kernel()
            sig = gc.fwd_signature(fn)
            div = [n for n, t in sig.items() if t.startswith("*") or n.startswith(("sq", "sk", "sv", "so"))]
            consts = {"H": heads, "D": hidden, "KS": k, "BM": mod.BM, "RING": ring, "num_warps": mod.NUM_WARPS}
            sass = Path(tmp) / "k.sass"
            res = gc.compile_gluon(fn, sig, consts, mod.NUM_WARPS, sass_path=str(sass), divisible=div)
            row = {"variant": name, "registers": res["registers"], "stack_bytes": res["stack_bytes"],
                   "shared_bytes": res["shared_bytes"], "sass_total": res["sass"]["total"],
                   "per_window": window_census(sass.read_text(), mod.BM // 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def time_variants(names, T: int, ring: int = 2) -> list:
    import torch

    from lenx.attention import DapeV2, KerpleLog
    from lenx.bench.kernels import median_ms
    from lenx.ops.dape_v2 import gluon as G

    dev = torch.device("cuda")
    H, dh, D, ks = 12, 64, 32, 3
    torch.manual_seed(0)
    proc = DapeV2(H, D, ks, with_bias=True).to(dev)
    w = [x.detach() for x in proc.conv_weights()]
    q, k, v = (torch.randn(1, H, T, dh, device=dev, dtype=torch.bfloat16) for _ in range(3))
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        prepared = G.prepare(*w, KerpleLog(H).to(dev).table(T, dev).detach(), T, H, dev)
        for name in names:
            mod = load_variant(name, Path(tmp))
            ms = median_ms(lambda: mod.dape_v2_chain_forward(q, k, v, *w, prepared=prepared, ring=ring), 25, 200, 30)[0]
            rows.append({"variant": name, "T": T, "ring": ring, "fwd_ms": ms})
            print(json.dumps(rows[-1]), flush=True)
    base = next((r["fwd_ms"] for r in rows if r["variant"] == "base"), None)
    for r in rows:
        if base is not None:
            r["saved_ms"] = base - r["fwd_ms"]
    return rows


def main():
    ap = argparse.ArgumentParser(description="Time (or compile) chain.py with one stage left out at a time.")
    ap.add_argument("-o", "--out", required=True, help="JSON file to write")
    ap.add_argument("--T", type=int, default=8192, help="sequence length of the timing (default 8192)")
    ap.add_argument("--only", default="", help="variant names separated by ';' (default: all)")
    ap.add_argument("--ring", type=int, default=2, choices=(2, 3, 4), help="K/V ring slots of every variant (default 2)")
    ap.add_argument("--compile", action="store_true", help="compile offline for sm_90a instead of timing")
    a = ap.parse_args()
    names = [x for x in a.only.split(";") if x] or list(VARIANTS)
    unknown = [x for x in names if x not in VARIANTS]
    if unknown:
        ap.exit(2, f"error: unknown variant {unknown[0]!r} (known: {'; '.join(VARIANTS)})\n")
    for name in names:  # every anchor checked before any work
        variant_source(name)
    sys.path.insert(0, str(ROOT / "src"))
    if a.compile:  # the offline venv has triton 3.6 but no torch
        import triton

        rows, env = compile_variants(names, a.ring), {"triton": triton.__version__, "target": "sm_90a (offline)"}
    else:
        from lenx.runinfo import environment

        rows, env = time_variants(names, a.T, a.ring), environment()
    with open(a.out, "w") as f:
        json.dump({"environment": env, "command": " ".join(sys.argv), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
