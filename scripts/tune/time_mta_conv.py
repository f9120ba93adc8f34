"""MTA's query-key convolution on score maps [B, H, T, T]: PyTorch's depthwise conv2d (reference._conv,
the path LENX_MTA_CONV=torch keeps) against the Triton stencil (lenx.ops.mta.conv.mta_conv), forward
and forward+backward (dx and dw), medians of CUDA-event timings after a warmup, with each shape's
relative error of the stencil against the conv2d (output, dx, dw) first.

Usage (repository root, a CUDA machine):
    PYTHONPATH=src python3 scripts/tune/time_mta_conv.py -o time_mta_conv.json
        [--shapes 32x512,8x2048] [--heads 12] [--kernel 6x11] [--dtype bf16]
        [--tiles "64x256/64x128;64x512/64x128;64x128/32x128;32x256/64x256"]
--shapes: BxT maps (default the 125m step's B 32 x T 512 and B 8 x T 2048); --tiles: the kernels' tiles
to time, each STREAM/DW as BMxBN (rows walked x keys wide; the first is mta_conv's default). The JSON
holds one row per (shape, path, tiles) with fwd_ms, fwd_bwd_ms and the Triton kernels' speedups over
torch's, and the torch, triton, CUDA versions and the GPU's name.
"""

import argparse
import json
import platform
import sys

import torch
import triton

from lenx.ops.mta.conv import mta_conv
from lenx.ops.mta.reference import _conv

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def pair(text: str) -> tuple[int, int]:
    a, b = text.lower().split("x")
    return int(a), int(b)


def median_ms(fn, warmup: int = 3, reps: int = 20) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def timings(conv, x, w, g) -> dict:
    def fwd():
        with torch.no_grad():
            conv(x, w)

    def fwd_bwd():
        torch.autograd.grad(conv(x, w), (x, w), g)
    return {"fwd_ms": median_ms(fwd), "fwd_bwd_ms": median_ms(fwd_bwd)}


def errors(x, w, g, tiles) -> dict:
    """Relative errors (norm-wise) of the Triton kernels against conv2d in fp32 on the same values."""
    outs = []
    for conv, xx, ww in ((lambda a, b: mta_conv(a, b, tiles), x, w),
                         (_conv, x.detach().float().requires_grad_(), w.detach().requires_grad_())):
        y = conv(xx, ww)
        outs.append((y, *torch.autograd.grad(y, (xx, ww), g.to(y.dtype))))
    return {name: float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())
            for name, a, b in zip(("y", "dx", "dw"), *outs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", required=True, help="the JSON file written")
    ap.add_argument("--shapes", default="32x512,8x2048", help="BxT score maps, comma-separated")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kernel", default="6x11", help="c_q x c_k")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--tiles", default="64x256/64x128;64x512/64x128;64x128/32x128;32x256/64x256",
                    help="STREAM/DW tiles BMxBN, ';'-separated")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: time_mta_conv.py needs a CUDA device", file=sys.stderr)
        sys.exit(2)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False  # the errors' reference
    c_q, c_k = pair(args.kernel)
    settings = [dict(zip(("stream", "dw"), (pair(t) for t in s.split("/")))) for s in args.tiles.split(";")]
    rows = []
    for shape in args.shapes.split(","):
        B, T = pair(shape)
        torch.manual_seed(0)
        x = torch.randn(B, args.heads, T, T, device="cuda", dtype=DTYPES[args.dtype], requires_grad=True)
        w = torch.randn(args.heads, 1, c_q, c_k, device="cuda", requires_grad=True)
        g = torch.randn_like(x)
        base = {"B": B, "H": args.heads, "T": T, "kernel": [c_q, c_k], "dtype": args.dtype}
        ref = base | {"path": "torch"} | timings(_conv, x, w, g)
        rows.append(ref)
        print(ref, flush=True)
        for tiles in settings:
            row = base | {"path": "triton", "tiles": tiles, "errors": errors(x, w, g, tiles)}
            row |= timings(lambda a, b, tiles=tiles: mta_conv(a, b, tiles), x, w, g)
            row |= {f"speedup_{k[:-3]}": ref[k] / row[k] for k in ("fwd_ms", "fwd_bwd_ms")}
            rows.append(row)
            print(row, flush=True)
        del x, g
        torch.cuda.empty_cache()
    result = {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
              "gpu": torch.cuda.get_device_name(), "python": platform.python_version(), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
