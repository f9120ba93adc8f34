"""Times copies of skewed.py from several commits side by side on one GPU: one layer fwd+bwd,
profiler kernel time (time_skewed.py's cases), after a bf16 check of each against the fp32 reference.
Make the copies (absolute imports) in scripts/tune/_variants/, left untracked (untracked files travel):
  git show REV:src/lenx/ops/dape_v2/skewed.py | sed 's/from \\.\\._launch/from lenx.ops._launch/;
      s/from \\.reference/from lenx.ops.dape_v2.reference/' > scripts/tune/_variants/NAME.py
Usage (repository root on a CUDA machine):
  PYTHONPATH=$PWD/src:$PWD/scripts/tune python3 scripts/tune/time_variants.py OUT.json NAME,NAME BxT,BxT"""
import importlib.util
import json
import sys
from pathlib import Path
import torch
import time_skewed as ts
from lenx.ops.dape_v2.reference import dape_v2_reference

here = Path(__file__).parent / "_variants"
res = {"rows": [], "checks": []}
mods = {}
for name in sys.argv[2].split(","):
    spec = importlib.util.spec_from_file_location(name, here / f"{name}.py")
    mods[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mods[name])
    ts.CASES[name] = (lambda m: lambda q, k, v, T: m.dape_v2_skewed(q, k, v, *ts.proc.conv_weights(), ts.kb.table(T, ts.dev)))(mods[name])
for name in mods:
    ts.CASES["dapev2-skewed"] = ts.CASES[name]
    for B, T in ((2, 1000), (1, 4096)):
        try:
            c = ts.check(B, T); c["variant"] = name
        except Exception as err:  # noqa: BLE001
            c = {"variant": name, "error": repr(err)[:300]}; print(c, flush=True)
        res["checks"].append(c)
shapes = [tuple(int(x) for x in s.split("x")) for s in sys.argv[3].split(",")]
for B, T in shapes:
    for name in ["sdpa", "kerple"] + list(mods):
        try:
            row = ts.profile(name, B, T)
        except Exception as err:  # noqa: BLE001
            row = {"case": name, "B": B, "T": T, "error": repr(err)[:300]}; print(row, flush=True)
        res["rows"].append(row)
        json.dump(res, open(sys.argv[1], "w"), indent=1)
for name, m in mods.items():
    out = {}
    for k in ("_conv_z", "_conv_f", "_conv_dy", "_conv_dx"):
        try:
            out[k] = [{"regs": kern.n_regs, "spills": kern.n_spills} for cache in getattr(m, k).device_caches.values() for kern in cache[0].values()]
        except Exception as err:  # noqa: BLE001
            out[k] = repr(err)[:100]
    res.setdefault("registers", {})[name] = out
    print(name, out, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
