"""Every matrix product MTA's chunked path hands to torch, forward and backward (with each block's
recompute), reads and writes operands that cuBLAS's Hopper kernels take: a data pointer on 16 bytes
and every stride but the unit one a whole number of 16 bytes (the head mixing's 12 x 12 weights had
rows of 24 bytes in bf16). Aligned operands did not take cuBLAS off its sm80 wmma kernels on an
H200: the mixing's forward and dx still ran one (K = 12), and the split weight gradient a magma
kernel (results/bench/h200_land_78053f5); the mixing needs its own kernel. Recorded on the CPU
below autograd (the aten products the GPU runs, one cuBLAS call each), under bf16 autocast as the
training step; the released configuration's 12 heads in one group, blocks cut inside the query
halo. Also: the mixing's values and gradients are the plain matmul's (the split weight gradient
and the aligned copies of the weights change no value beyond the order of a sum)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import assert_close
from lenx.attention import Attention
from lenx.attention.backends import chunked_attention
from lenx.config import AttentionConfig
from lenx.ops.mta.reference import mix_heads

PRODUCTS = ("mm", "bmm", "baddbmm", "addmm", "addbmm")


class Products(TorchDispatchMode):
    """(operator, [(shape, strides, data pointer, bytes an entry)] of its tensor inputs and output)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func._opname in PRODUCTS:
            tensors = [t for t in (*args, out) if isinstance(t, torch.Tensor) and t.dim() >= 2]
            self.calls.append((func._opname, [(tuple(t.shape), t.stride(), t.data_ptr(), t.element_size())
                                               for t in tensors]))
        return out


def misaligned(shape, strides, pointer, size) -> list[str]:
    bad = [] if pointer % 16 == 0 else [f"pointer {pointer} % 16 = {pointer % 16}"]
    unit = strides.index(1) if 1 in strides else None
    for dim, (n, stride) in enumerate(zip(shape, strides)):
        if dim != unit and n > 1 and stride * size % 16:
            bad.append(f"stride {stride} of dim {dim} ({stride * size} bytes)")
    return bad


def products(layer: int, head_dim: int = 8, T: int = 64, chunk: int = 32):
    """The products of layer `layer` of 12 (the convolutions on 2, 6, 10) on 12 heads, B 2."""
    torch.manual_seed(0)
    attn = Attention(AttentionConfig(method="mta"), 12, 12 * head_dim, None, layer, 12)
    assert attn.processor.pre_mix.shape == (1, 12, 12) and (attn.processor.conv_kernel is not None) == (layer == 2)
    qkv = torch.randn(2, T, 3, 12, head_dim, requires_grad=True)  # the projection's layout, as the layer's
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16), Products() as mode:
        out, _ = chunked_attention(q, k, v, attn.parts, chunk)
        out = attn.processor.finish(out)
        out.float().square().sum().backward()
    return mode.calls


@pytest.mark.parametrize("layer", [0, 2])
def test_every_product_is_aligned(layer):
    """Fails before the aligned mixing: w [B, 12, 12] strides (0, 12, 1) (24-byte rows) forward,
    the same transposed for dx, and dw's [B, 12, 12] output."""
    calls = products(layer)
    weighted = [name for name, tensors in calls if tensors[0][0][-2:] == (12, 12)]
    assert len(weighted) == 2 * 2 * 3, calls  # two mixings a block, two blocks: forward, recompute and dx
    bad = [(name, shape, why) for name, tensors in calls for shape, *rest in tensors
           for why in misaligned(shape, *rest)]
    assert not bad, bad


@pytest.mark.parametrize("shape, groups, split", [((2, 12, 16, 16), 1, 16), ((3, 4, 8, 32), 2, 16),
                                                  ((2, 4, 7, 9), 2, 16), ((2, 6, 24, 8), 3, 4)])
def test_the_mixing_is_the_matmul(shape, groups, split):
    """float64: the values, and both gradients to rounding, against the plain matmul; the split
    weight gradient (N 256, 192, 63 (not split: no whole 16-byte parts), 192 in 4)."""
    torch.manual_seed(1)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    c = shape[1] // groups
    w = torch.randn(groups, c, c, dtype=torch.float64, requires_grad=True)
    got = mix_heads(x, w, split)
    want = torch.matmul(w, x.reshape(shape[0], groups, c, -1)).view(shape)
    assert_close(got, want, 1e-14)
    g = torch.randn_like(want)
    for a, b, what in zip(torch.autograd.grad(got, (x, w), g), torch.autograd.grad(want, (x, w), g), "xw"):
        assert_close(a, b, 1e-13, f"d{what}")


def test_the_bf16_weight_gradient_is_no_worse():
    """bf16 autocast (the training step): dw summed in fp32 from the split's parts is at least as
    near the float64 gradient of the same bf16 inputs as the plain matmul's (bf16 a map, summed)."""
    torch.manual_seed(2)
    x = torch.randn(4, 12, 32, 32).bfloat16().float().requires_grad_()
    w = torch.randn(1, 12, 12).bfloat16().float().requires_grad_()
    g = torch.randn(4, 12, 32, 32).bfloat16()
    exact = torch.autograd.grad(mix_heads(x.double(), w.double()), w, g.double())[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        split = torch.autograd.grad(mix_heads(x, w), w, g)[0]
        plain = torch.autograd.grad(torch.matmul(w, x.reshape(4, 1, 12, -1)).view(x.shape), w, g)[0]
    err = [(d.double() - exact).norm() / exact.norm() for d in (split, plain)]
    assert err[0] <= err[1] + 1e-4 and err[0] < 1e-2, err
