"""What MTA's chunked path runs on its score maps, counted on the CPU (the aten operators below
autograd, about one GPU kernel each): the head mixing copies no map (a matmul over the map as it
lies, not an einsum that permutes it in and out), a layer without a convolution masks each block
once (the softmax's -inf; Mask_0's zeros are read by no convolution there), the softmax's mask
fills the map in the scores' dtype before widening it, every fill is a torch.where (a masked_fill
clones the map first), and 1/sqrt(d) rides on the q.k product
where it is a power of two. The values: test_mta_attention.py and tests/ops/test_mta.py (and here,
the scaled product's, alone and through MTA against the loops)."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import assert_close
from mta_helpers import attention, full, qkv
from lenx.attention.backends import chunked_attention
from lenx.attention.backends.reference import _raw_scores
from lenx.ops.mta.reference import mta_loops

B, H, T, D, CHUNK = 2, 4, 48, 4, 16  # q, k and v hold B H T D = 1536 entries; the smallest map 2048


class MapOps(TorchDispatchMode):
    """(operator, dtype) of each operator that writes a tensor of a score map's size or more."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) else out
        if not func.is_view and isinstance(first, torch.Tensor) and first.numel() >= B * H * CHUNK * CHUNK:
            self.ops.append((func._opname, first.dtype))
        return out


def map_ops(convolved: bool, dtype=torch.float32):
    """The map-sized operators of one MTA layer's chunked forward and of its backward (which
    recomputes each block): the released configuration on 4 heads in 2 groups of 2, the
    convolutions on layer 1 of 2."""
    attn = attention("mta", n_head=H, head_dim=D, layer=(int(convolved), 2), mta_every=2,
                     mta_post_conv=True).to(dtype)
    assert (attn.processor.conv_kernel is not None) == convolved and attn.processor.pre_mix.shape == (2, 2, 2)
    torch.manual_seed(2)
    q, k, v = (torch.randn(B, H, T, D, dtype=dtype, requires_grad=True) for _ in range(3))
    with MapOps() as forward:
        out, _ = chunked_attention(q, k, v, attn.parts, CHUNK)
    with MapOps() as backward:
        out.backward(torch.randn_like(out))
    return forward.ops, backward.ops


@pytest.mark.parametrize("convolved", [False, True])
def test_the_head_mixing_copies_no_map(convolved):
    """Measured: no map-sized copy either way; before, 3 a block forward (the two einsums'
    permuted inputs and the post-softmax one's output) and 5 in the backward (with the recompute)."""
    for ops in map_ops(convolved):
        copies = [name for name, _ in ops if name in ("clone", "copy_", "_to_copy", "contiguous")]
        assert not copies, copies


def test_a_layer_without_a_convolution_masks_each_block_once():
    """The softmax's -inf fill only (3 blocks); before, Mask_0's zeros too: 6."""
    forward, _ = map_ops(False)
    assert [name for name, _ in forward].count("where") == T // CHUNK


def test_the_softmax_masks_in_the_scores_dtype():
    """bf16 scores: every map-sized fill is a bf16 one (before, the -inf fill ran on the fp32 copy)."""
    forward, backward = map_ops(False, torch.bfloat16)
    fills = [dtype for name, dtype in forward + backward if name == "where"]
    assert fills and set(fills) == {torch.bfloat16}, fills


@pytest.mark.parametrize("convolved", [False, True])
def test_every_fill_is_a_where(convolved):
    """A map-sized masked_fill (its forward, or the backward's grad.masked_fill) is a clone of the map
    and a fill of the clone on a GPU (a Memcpy DtoD and a kernel): every fill is a torch.where, one
    pass (before, every one was a masked_fill)."""
    forward, backward = map_ops(convolved)
    names = [name for name, _ in forward + backward]
    assert "masked_fill" not in names and names.count("where") == (36 if convolved else 9), names


def test_the_score_scale_rides_on_the_product():
    """d = 4: no map-sized pass scales the scores (before: a division forward, one more backward)."""
    for ops in map_ops(False):
        assert not [name for name, _ in ops if name in ("div", "mul")], ops


@pytest.mark.parametrize("d", [4, 16, 64, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_scaled_product_is_the_product_divided(d, dtype):
    """A power-of-two scale is exact: the same scores, and gradients to rounding (d = 8 divides)."""
    torch.manual_seed(d)
    q, k = (torch.randn(2, 3, n, d, dtype=dtype, requires_grad=True) for n in (5, 9))
    raw = _raw_scores(q, k)
    want = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
    assert raw.shape == want.shape and torch.equal(raw, want)
    g = torch.randn_like(raw)
    for got, ref in zip(torch.autograd.grad(raw, (q, k), g), torch.autograd.grad(want, (q, k), g)):
        torch.testing.assert_close(got, ref)
    assert torch.equal(_raw_scores(q, k[:1, :1]), torch.matmul(q, k[:1, :1].transpose(-1, -2)) / math.sqrt(d))


def test_the_scaled_product_through_mta_is_the_loops():
    """d = 4 (the scale in the product), both mixings, a convolution, blocks cut inside its halo."""
    attn = attention("mta", head_dim=4)
    p = attn.processor
    q, k, v = qkv(11, head_dim=4)
    want = mta_loops(q, k, v, p.conv_kernel, p.pre_mix, p.post_mix, None, (p.norm_weight, p.gate.weight[0], p.gate.bias))
    for backend in ("dense", "chunked"):
        assert_close(full(attn, q, k, v, backend, chunk=4), want, 1e-10, backend)


def test_one_block_is_returned_as_it_is():
    """T <= chunk_size (the 125m step: T 512 in one block): the block's output is the path's, no cat
    copies it (before: one copy of [B, H, T, d] a layer forward)."""
    attn = attention("mta", n_head=H, head_dim=D)
    q, k, v = qkv(T, n_head=H, head_dim=D)
    with OpNames() as names:
        chunked_attention(q, k, v, attn.parts, T)
    assert names.ops and "cat" not in names.ops, names.ops


class OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func._opname)
        return func(*args, **(kwargs or {}))
