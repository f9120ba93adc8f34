"""Compile the skewed DAPE V2 training kernels (src/lenx/ops/dape_v2/skewed.py, or the copy named by
--module) for sm_90a without a GPU and print registers, stack (spills) and shared memory per kernel at
the headline shape: bf16, H 12, d 64, D 32, k 3, the module's CONFIG tiles. The kernels with F's
residual switch (_conv_z, _conv_f: RES; _attn_fwd, _attn_bwd: the edge term's NE) are compiled with
it off ("name") and on ("name+res").

Usage (repository root; triton 3.6 as on the device, torch from lenx's venv):
  PYTHONPATH=src:/work/main/.venv/lib/python3.11/site-packages /work/venv-t36/bin/python \
      scripts/tune/compile_skewed.py [--module lenx.ops.dape_v2.skewed] [--tiles attn_fwd=128,32,8,2 ...]

--tiles compiles only the kernels named, at the settings given (BM,BN,warps,stages), for a sweep's
candidates before device time.
"""

import argparse
import importlib
import inspect
import json

import triton
import triton.language as tl

from offline_compile import compile_one  # scripts/tune/offline_compile.py: compile + cuobjdump

BF16 = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV", "SB", "FB", "GB", "DSB", "ZB", "DYB", "W1C", "W2C", "W2Z", "W1X",
        "W1T", "W2T"}  # the buffers and packed conv weights too


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", default="lenx.ops.dape_v2.skewed")
    ap.add_argument("--tiles", nargs="*", default=[], help="KERNEL=BM,BN,WARPS,STAGES: only these, at these settings")
    a = ap.parse_args()
    mod = importlib.import_module(a.module)
    only = {kv.split("=")[0]: tuple(int(x) for x in kv.split("=")[1].split(",")) for kv in a.tiles}
    H, HP, D, DP, KS, DH = 12, 16, 32, 32, 3, 64
    out = {"triton": triton.__version__, "module": a.module}
    for name, tiles in (only or mod.CONFIG).items():
        fn = getattr(mod, "_" + name, None)
        if fn is None:
            continue
        BM, BN, nw, ns = tiles
        params = inspect.signature(fn.fn).parameters
        for res in (False, True) if {"RES", "NE"} & set(params) else (False,):
            conv = dict(H=H, HP=HP, KS=KS, DP=DP, CDT=tl.bfloat16, PREC="tf32", RES=res)
            flash = dict(H=H, HP=HP, DH=DH, NE=2 * (KS // 2) if res else 0, PREC="tf32")  # NE: the edge term's keys
            consts = {k: v for k, v in {**(conv if "KS" in params else flash), "BM": BM, "BN": BN,
                                        "KP": triton.next_power_of_2(KS * HP), "KZ": triton.next_power_of_2(KS * DP),
                                        "KSP": triton.next_power_of_2(KS)}.items() if k in params}
            key = name + ("+res" if res else "")
            try:
                out[key] = {"tiles": tiles, **compile_one(fn, consts, nw, ns, BF16)}
            except Exception as err:  # noqa: BLE001
                out[key] = {"tiles": tiles, "error": f"{type(err).__name__}: {str(err)[:300]}"}
            print(key, out[key], flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
