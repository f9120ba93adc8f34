"""Where the Gluon DAPE V2 forward's time goes, without hardware counters: time copies of
src/lenx/ops/dape_v2/gluon.py with one stage left out (source edits, written to a temporary module)
and take differences. The outputs of the ablated kernels are wrong by design; only their times count.

Usage (repository root, sm_90 GPU, triton 3.6):
    PYTHONPATH=src python3 scripts/tune/ablate_gluon.py --T 8192 -o ablate.json
"""

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch

from lenx.attention import DapeV2, KerpleLog
from lenx.bench.kernels import median_ms
from lenx.runinfo import environment

SRC = Path(__file__).resolve().parents[2] / "src" / "lenx" / "ops" / "dape_v2" / "gluon.py"

STEP1 = "            # 1. scores of every head -> conv1 input (fp16, tril applied)\n            for h in gl.static_range(H):"
STEP2 = "        for ip in range(BM // 2):"
STEP3 = "            for h in gl.static_range(H):\n                t2 = t2n"
K0 = "                if ws < HALF:"
CONV2 = "            f = _tapsum(warpgroup_mma(w2, Zb, gl.zeros([128, 128], gl.float32, ACC_Y), use_acc=False), KS)"
FT = "                fT = _load_T(XF.slice(h, 1, dim=1), sT)   # in S^T's layout: a conversion costs a barrier"
MAX = """                Mx.index(h % 2).store(_warp_max(lg))
                _thread_barrier()
                m_new = gl.maximum(gl.maximum(m_old, gl.maximum(Mxr.index(4 * (h % 2)).load(SROW), Mxr.index(4 * (h % 2) + 1).load(SROW))),
                                   gl.maximum(Mxr.index(4 * (h % 2) + 2).load(SROW), Mxr.index(4 * (h % 2) + 3).load(SROW)))"""
OLOAD = "                o = Os.index(h).load(ACC_S) * alpha[None, :]"
T2A = "            t2n = gl.load(t2_ptr, mask=valid, other=0.0)"
T2B = "                    t2n = gl.load(t2_ptr + (h + 1) * (2 * T - 1), mask=valid, other=0.0)"

# alternatives: the direct S^T-layout store (step 1) and load (step 3) put back through a layout conversion (each costs a barrier)
S1_STORE = "                XF.slice(h, 1, dim=1).store(x)   # in S^T's layout: a conversion costs a barrier"
F_LOAD = "                fT = _load_T(XF.slice(h, 1, dim=1), sT)   # in S^T's layout: a conversion costs a barrier"
ALT_S1 = [(S1_STORE, "                XF.slice(h, 1, dim=1).store(gl.convert_layout(x, LF3))")]
ALT_F = [(F_LOAD, "                fT = gl.convert_layout(gl.permute(gl.reshape(XF.slice(h, 1, dim=1).load(LF3), [BM, 64]), (1, 0)), ACC_S)")]

# name -> list of (old, new) source edits
VARIANTS = {
    "base": [],
    "no step 1 (QK -> Xst)": [(STEP1, STEP1.replace("static_range(H)", "static_range(0)"))],
    "no step 2 (convs)": [(STEP2, STEP2.replace("range(BM // 2)", "range(0)"))],
    "no step 3 (QK, softmax, PV)": [(STEP3, STEP3.replace("static_range(H)", "static_range(0)"))],
    "step 3 only": [(STEP1, STEP1.replace("static_range(H)", "static_range(0)")),
                    (STEP2, STEP2.replace("range(BM // 2)", "range(0)"))],
    "no k0 load": [(K0, K0.replace("ws < HALF", "ws < HALF - 1000000"))],
    "no conv2": [(CONV2, "            f = y")],
    "no t2 load": [(T2A, "            t2n = gl.zeros([64, BM], gl.float32, ACC_S)"),
                   (T2B, "                    t2n = gl.zeros([64, BM], gl.float32, ACC_S)")],
    "no f in step 3": [(FT, "                fT = sT.to(gl.float16)")],
    "no max exchange": [(MAX, "                m_new = m_old + 0.0")],
    "alt: step 1 stores through a layout conversion": ALT_S1,
    "alt: step 3 loads f through a layout conversion": ALT_F,
    "no O load": [(OLOAD, "                o = gl.zeros([64, BM], gl.float32, ACC_S) * alpha[None, :]")],
}


def load_variant(name: str, edits, tmp: Path):
    text = SRC.read_text()
    for old, new in edits:
        if text.count(old) != 1:
            raise SystemExit(f"variant {name!r}: edit anchor found {text.count(old)} times (gluon.py changed)")
        text = text.replace(old, new)
    text = text.replace("from .reference import", "from lenx.ops.dape_v2.reference import")
    path = tmp / f"gluon_variant_{len(list(tmp.iterdir()))}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--only", default="", help="variant names separated by ; (default: all)")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda")
    H, dh, D, ks, T = 12, 64, 32, 3, a.T
    torch.manual_seed(0)
    proc = DapeV2(H, D, ks, with_bias=True).to(dev)
    w = [x.detach() for x in proc.conv_weights()]
    q, k, v = (torch.randn(1, H, T, dh, device=dev, dtype=torch.bfloat16) for _ in range(3))
    tab = KerpleLog(H).to(dev).table(T, dev).detach()
    names = [x for x in a.only.split(";") if x] or list(VARIANTS)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        for name in names:
            mod = load_variant(name, VARIANTS[name], Path(tmp))
            ops = mod.prepare(*w, tab, T, H, dev)
            mod.prepare = lambda *args, ops=ops: ops
            ms = median_ms(lambda: mod.dape_v2_gluon_forward(q, k, v, *w, tab), 25, 200, 30)[0]
            rows.append({"variant": name, "T": T, "fwd_ms": ms})
            print(json.dumps(rows[-1]), flush=True)
    base = next((r["fwd_ms"] for r in rows if r["variant"] == "base"), None)
    for r in rows:
        if base:
            r["saved_ms"] = base - r["fwd_ms"]
    with open(a.out, "w") as f:
        json.dump({"environment": environment(), "command": " ".join(sys.argv), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
