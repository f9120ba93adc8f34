"""lenx.ops.mta.reference: the tensor form of MTA (the attention part's dense and chunked paths, and
the form alone) against explicit loops over every term of the paper's formula, in float64."""

import pytest
import torch

from helpers import assert_close
from lenx.ops.mta.reference import group_norm, mix_heads, mta_loops, mta_scores
from mta_helpers import attention, full, qkv


@pytest.mark.parametrize("mix", ["none", "pre", "post", "both"])
@pytest.mark.parametrize("T", [1, 7, 12])
def test_tensor_form_is_the_loops(T, mix):
    attn = attention("mta-alibi", mta_head_mix=mix)
    q, k, v = qkv(T)
    p = attn.processor
    pos = torch.arange(T)
    bias = attn.bias(pos, pos)
    want = mta_loops(q, k, v, p.conv_kernel, p.pre_mix, p.post_mix, bias, (p.norm_weight, p.gate.weight[0], p.gate.bias))
    assert_close(full(attn, q, k, v, "dense"), want, 1e-10, f"dense T={T} {mix}")
    assert_close(full(attn, q, k, v, "chunked", chunk=4), want, 1e-10, f"chunked T={T} {mix}")


def test_no_convolution_and_no_norm_are_the_loops_too():
    attn = attention("mta-nope", layer=(0, 2), mta_every=2, mta_group_norm=False)  # layer 0 of 2: no convolution
    assert attn.processor.conv_kernel is None and attn.processor.q_halo == 0
    q, k, v = qkv(9)
    want = mta_loops(q, k, v, None, attn.processor.pre_mix, attn.processor.post_mix)
    assert_close(full(attn, q, k, v, "dense"), want, 1e-10)



def test_mixing_and_norm_alone():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 3, 5, dtype=torch.float64)
    w = torch.randn(2, 3, 3, dtype=torch.float64)
    y = mix_heads(x, w)
    assert_close(y[:, 4], w[1, 1, 0] * x[:, 3] + w[1, 1, 1] * x[:, 4] + w[1, 1, 2] * x[:, 5], 1e-12)
    out = group_norm(x, torch.ones(5, dtype=torch.float64))
    assert_close(out.pow(2).mean(-1), torch.ones(2, 6, 3, dtype=torch.float64), 1e-4)
    scores = mta_scores(x[:, :, :, :3], None, None)  # no kernel: Mask_0 only, past keys kept
    assert (scores[..., 0, 1:] == 0).all() and torch.equal(scores[..., 2, :], x[..., 2, :3])
