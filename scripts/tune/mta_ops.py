"""The operators of one MTA layer's chunked attention, forward and backward (which recomputes each
block), counted on the CPU under bf16 autocast (the GPU's precision): those that write a tensor of a
score map's size or more (B H 256 256 entries: copies, casts, fills, matmuls, elementwise passes,
about one GPU kernel each), by kind, and how many smaller ones. The convolutions run as the Triton
one does on a GPU: in the map's dtype, counted as its kernels (one forward, dx and dw backward),
its own operators on the CPU not.
Deterministic for a given torch; no timing.

    PYTHONPATH=src python scripts/tune/mta_ops.py [--batch 2 --heads 12 --length 512 --head-dim 64 --chunk 256]
"""

import argparse
import contextlib
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import lenx.attention.mta as mta_module
from lenx.attention import Attention
from lenx.attention.backends import chunked_attention
from lenx.config import AttentionConfig
from lenx.ops.mta.reference import _conv


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
    for name, default in (("batch", 2), ("heads", 12), ("length", 512), ("head-dim", 64), ("chunk", 256)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    for layer in (0, 2):  # the released configuration convolves on layers 2, 6, 10
        fwd, bwd, small_f, small_b, convolved = count(layer, args.batch, args.heads, args.length, args.head_dim,
                                                       args.chunk)
        print(f"layer {layer} ({'convolutions' if convolved else 'no convolution'}): map-sized operators "
              f"forward {sum(fwd.values())}, backward {sum(bwd.values())}; smaller {small_f}, {small_b}")
        for kind in sorted(set(fwd) | set(bwd)):
            print(f"  {kind:50s} forward {fwd[kind]:3d}  backward {bwd[kind]:3d}")


if __name__ == "__main__":
    main()
