"""SSMax's s_h gradient, sum over b, t, d of dy y per head, at the 125m step's shape (B 32, H 12,
T 512, d 64, bf16): the plain expression `torch.sum(dy * y, dim=(0, 2, 3), dtype=fp32)` against
lenx.ops.head_dot's kernel (its default launch, then a sweep of programs and tile rows), timed back
to back by lenx.bench.kernels.median_ms, each with its effective bandwidth (two reads of the inputs) and
its error against float64 relative to sum |dy y|. Layouts: y as RoPE's kernel writes q for SDPA
(heads_last: [B, T, H, d] in memory) or contiguous, dy likewise.

Usage (repository root, a CUDA machine):
    PYTHONPATH=src python3 scripts/tune/ssmax_grad.py -o ssmax_grad.json
        [--shape 32x12x512x64] [--programs 132,264,512,1056] [--rows 32,64,128]
The JSON holds one row per (layouts, path, settings) with ms, GB/s, error and the speedup over the
plain expression, and the torch, triton, CUDA versions and the GPU's name.
"""

import argparse
import json
import platform
import sys

import torch
import triton

from lenx.bench.kernels import median_ms
from lenx.ops.head_dot.triton import head_dot

LAYOUTS = (("heads_last", "heads_last"), ("heads_last", "contiguous"), ("contiguous", "contiguous"))


def tensor(shape, layout):
    B, H, T, d = shape
    if layout == "heads_last":
        return torch.randn(B, T, H, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    return torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16)


def plain(dy, y):
    return torch.sum(dy * y, dim=(0, 2, 3), dtype=torch.float32)


def row(fn, dy, y, exact, scale, base) -> dict:
    ms = median_ms(lambda: fn(dy, y), 25, 200, 200)[0]  # back to back, as lenx bench times
    err = float(((fn(dy, y).double() - exact).abs() / scale).max())
    return base | {"ms": ms, "GBps": 2 * dy.numel() * dy.element_size() / ms / 1e6, "error": err}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", required=True, help="the JSON file written")
    ap.add_argument("--shape", default="32x12x512x64", help="BxHxTxd")
    ap.add_argument("--programs", default="132,264,512,1056", help="programs to sweep, comma-separated")
    ap.add_argument("--rows", default="32,64,128", help="tile rows to sweep, comma-separated")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: ssmax_grad.py needs a CUDA device", file=sys.stderr)
        sys.exit(2)
    try:
        shape = tuple(int(v) for v in args.shape.lower().split("x"))
        programs, tile_rows = ([int(v) for v in s.split(",")] for s in (args.programs, args.rows))
    except ValueError:
        print(f"error: --shape is BxHxTxd and --programs, --rows comma-separated integers, got "
              f"{args.shape!r}, {args.programs!r}, {args.rows!r}", file=sys.stderr)
        sys.exit(2)
    if len(shape) != 4:
        print(f"error: --shape is BxHxTxd, got {args.shape!r}", file=sys.stderr)
        sys.exit(2)
    rows = []
    for y_layout, dy_layout in LAYOUTS:
        torch.manual_seed(0)
        y, dy = tensor(shape, y_layout), tensor(shape, dy_layout)
        p = dy.double() * y.double()
        exact, scale = p.sum((0, 2, 3)), p.abs().sum((0, 2, 3))
        del p
        base = {"shape": list(shape), "y": y_layout, "dy": dy_layout}
        ref = row(plain, dy, y, exact, scale, base | {"path": "torch"})
        found = [ref, row(head_dot, dy, y, exact, scale, base | {"path": "kernel", "settings": "default"})]
        for n in programs:
            for r in tile_rows:
                fn = lambda a, b, n=n, r=r: head_dot(a, b, programs=n, block_rows=r)  # noqa: E731
                found.append(row(fn, dy, y, exact, scale, base | {"path": "kernel", "programs": n, "block_rows": r}))
        for r in found:
            r["speedup"] = ref["ms"] / r["ms"]
            print(r, flush=True)
        rows += found
        del y, dy
        torch.cuda.empty_cache()
    result = {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
              "gpu": torch.cuda.get_device_name(), "python": platform.python_version(), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
