"""The operators of one MTA layer's chunked attention, forward and backward (which recomputes each
block), counted on the CPU under bf16 autocast (the GPU's precision): those that write a tensor of a
score map's size or more (B H 512 512 entries at the 125m preset's chunk of 512: copies, casts,
fills, matmuls, elementwise passes, about one GPU kernel each), by kind, and how many smaller ones.
The convolutions run as the Triton one does on a GPU: in the map's dtype, counted as its kernels
(one forward, dx and dw backward), its own operators on the CPU not. Deterministic for a given
torch (no timing but --time's).

--time (a GPU): the head mixing alone on one block's map [B, H, T, T] in bf16, forward and backward,
as lenx runs it (aligned weights, the weight gradient split in --splits parts of each map's N) and as
a plain torch.matmul (the 12 x 12 weights as they lie), with the median ms and the GPU kernels of
each (cuBLAS names its sm80 fallbacks "wmma ... align2"); and a map's -inf fill by masked_fill
against torch.where.

    PYTHONPATH=src python scripts/tune/mta_ops.py [--batch 2 --heads 12 --length 512 --head-dim 64 --chunk 512]
    PYTHONPATH=src python scripts/tune/mta_ops.py --time --batch 32 [--splits 1,8,16,32]
"""

import argparse
import contextlib
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import lenx.attention.mta as mta_module
from lenx.attention import Attention
from lenx.attention.backends import chunked_attention
from lenx.bench.kernels import median_ms
from lenx.config import AttentionConfig
from lenx.ops.mta.reference import _conv, mix_heads


class _Conv(torch.autograd.Function):
    """reference._conv out of the counter's sight, counted as the Triton kernels: one forward, two
    backward (dx and dw)."""

    @staticmethod
    def forward(ctx, x, kernel, mode):
        ctx.save_for_backward(x, kernel)
        ctx.mode = mode
        with mode.out_of_sight("Triton convolution", 1), torch.autocast("cpu", enabled=False):
            return _conv(x, kernel.to(x.dtype))

    @staticmethod
    def backward(ctx, g):
        x, kernel = ctx.saved_tensors
        with ctx.mode.out_of_sight("Triton convolution", 2), torch.enable_grad(), \
                torch.autocast("cpu", enabled=False):
            xx, kk = x.detach().requires_grad_(), kernel.detach().to(x.dtype).requires_grad_()
            dx, dk = torch.autograd.grad(_conv(xx, kk), (xx, kk), g.to(x.dtype))
        return dx, dk.to(kernel.dtype), None


class MapOps(TorchDispatchMode):
    def __init__(self, map_size: int):
        super().__init__()
        self.map_size, self.kinds, self.smaller, self.hidden = map_size, Counter(), 0, False

    @contextlib.contextmanager
    def out_of_sight(self, kind: str, kernels: int):
        """Counts `kernels` of `kind` for what runs inside, not its operators."""
        self.kinds[kind] += kernels
        self.hidden = True
        try:
            yield
        finally:
            self.hidden = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.hidden or func.is_view or func._opname in ("view", "_unsafe_view", "alias", "detach"):
            return out
        first = out[0] if isinstance(out, (tuple, list)) else out
        if not isinstance(first, torch.Tensor) or first.numel() < self.map_size:
            self.smaller += 1
        else:
            self.kinds[_kind(func._opname, [a for a in args if isinstance(a, torch.Tensor)], first)] += 1
        return out


def _kind(name, inputs, out) -> str:
    dtype = str(out.dtype).removeprefix("torch.")
    if name in ("clone", "copy_") or (name == "_to_copy" and inputs[0].dtype == out.dtype):
        return "layout copy"
    if name == "_to_copy":
        return f"cast to {dtype}"
    if name in ("bmm", "baddbmm"):
        a, b = inputs[-2].shape, inputs[-1].shape
        return f"{name} {a[-2]}x{a[-1]} @ {b[-2]}x{b[-1]}, batch {b[0]}"
    return f"{name} {dtype}"


def count(layer: int, batch: int, heads: int, length: int, head_dim: int, chunk: int):
    """(forward kinds, backward kinds, smaller ops forward, backward, convolved) of layer `layer` of 12."""
    torch.manual_seed(0)
    attn = Attention(AttentionConfig(method="mta"), heads, heads * head_dim, None, layer, 12)
    mode = MapOps(batch * heads * min(chunk, length) ** 2)

    mta_module.score_conv = lambda x, kernel, documents=None: _Conv.apply(x, kernel, mode)
    q, k, v = (torch.randn(batch, heads, length, head_dim, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with mode:
            out, _ = chunked_attention(q, k, v, attn.parts, chunk)
            out = attn.processor.finish(out)
        forward, smaller = mode.kinds.copy(), mode.smaller
        with mode:
            out.backward(torch.randn_like(out))
    return forward, mode.kinds - forward, smaller, mode.smaller - smaller, attn.processor.conv_kernel is not None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("batch", 2), ("heads", 12), ("length", 512), ("head-dim", 64), ("chunk", 512)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--time", action="store_true", help="time the head mixing and the fill on a GPU")
    parser.add_argument("--splits", default="1,8,16,32", help="--time: the weight gradient's splits")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if args.time:
        if not torch.cuda.is_available():
            parser.error("--time needs a CUDA device")
        splits = [int(s) for s in args.splits.split(",") if s.isdigit() and int(s) > 0]
        if len(splits) != len(args.splits.split(",")):
            parser.error(f"--splits must be positive integers separated by commas, got {args.splits!r}")
        time_mixing(args.batch, args.heads, args.length, splits, args.reps)
        return
    for layer in (0, 2):  # the released configuration convolves on layers 2, 6, 10
        fwd, bwd, small_f, small_b, convolved = count(layer, args.batch, args.heads, args.length, args.head_dim,
                                                       args.chunk)
        print(f"layer {layer} ({'convolutions' if convolved else 'no convolution'}): map-sized operators "
              f"forward {sum(fwd.values())}, backward {sum(bwd.values())}; smaller {small_f}, {small_b}")
        for kind in sorted(set(fwd) | set(bwd)):
            print(f"  {kind:50s} forward {fwd[kind]:3d}  backward {bwd[kind]:3d}")


def _timed(fn, reps: int):
    """(median ms of fn on the GPU, back to back: lenx.bench.kernels.median_ms; the names of the GPU
    kernels of one call). reps: at most this many calls a batch."""
    ms = median_ms(fn, 25, 200, reps)[0]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"})
    return ms, names


def time_mixing(batch: int, heads: int, length: int, splits, reps: int):
    torch.manual_seed(0)
    x = torch.randn(batch, heads, length, length, device="cuda", requires_grad=True)
    w = (torch.eye(heads) + 0.1 * torch.randn(heads, heads)).to("cuda")[None].requires_grad_()
    g = torch.randn(batch, heads, length, length, device="cuda", dtype=torch.bfloat16)

    def mixing(split):
        def run():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = mix_heads(x, w, split) if split else torch.matmul(w, x.view(batch, 1, heads, -1)).view(x.shape)
            torch.autograd.grad(out, (x, w), g)
        return run

    print(f"head mixing [{batch}, {heads}, {length}, {length}] bf16, forward + backward (dx, dw):")
    for split in [0, *splits]:
        ms, names = _timed(mixing(split), reps)
        print(f"  {'plain matmul' if not split else f'lenx, split {split}':18s} {ms:8.3f} ms")
        for name in names:
            print(f"      {name[:110]}")
    # forward alone: lenx's (K = 12 from rows of 16), and the same as a K = 16 c_h product with the
    # weights as kron(w, I_16) over each map read as [16 c_h, N / 16] rows (aligned K, 16x the flops)
    z, xb = batch, x.detach().bfloat16().view(batch, heads, -1)
    kron = torch.kron(w.detach()[0], torch.eye(16, device="cuda")).bfloat16().expand(z, -1, -1).contiguous()
    forwards = {"lenx forward": lambda: mix_heads(xb.view(x.shape), w.detach()),
                "kron forward": lambda: torch.bmm(kron, xb.view(z, 16 * heads, -1))}
    for name, run in forwards.items():
        ms, names = _timed(run, reps)
        print(f"  {name:18s} {ms:8.3f} ms   {'; '.join(n[:60] for n in names)}")
    scores = torch.randn(batch, heads, length, length, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    allowed = torch.ones(length, length, device="cuda", dtype=torch.bool).tril()
    fills = {"masked_fill": lambda: scores.masked_fill(~allowed, float("-inf")),
             "where": lambda: torch.where(allowed, scores, float("-inf"))}
    print("the -inf fill of a bf16 map, forward + backward:")
    for name, fill in fills.items():
        ms, _ = _timed(lambda: torch.autograd.grad(fill(), scores, g), reps)
        print(f"  {name:18s} {ms:8.3f} ms")


if __name__ == "__main__":
    main()
