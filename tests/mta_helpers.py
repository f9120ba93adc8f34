"""What the MTA tests share: a float64 attention layer with MTA weights off the identity, inputs, and
the layer's output on a reference backend."""

import torch

from lenx.attention import Attention
from lenx.attention.backends import chunked_attention, dense_attention
from lenx.config import AttentionConfig


def attention(method="mta", n_head=4, head_dim=8, seed=0, layer=(0, 1), **cfg):
    """A float64 attention layer of `method` (layer[0] of layer[1]) whose MTA weights are moved off
    the identity; without the post-softmax convolution unless `cfg` asks for it (mta_loops is the
    formula without it; test_mta_post_conv.py has its own loops)."""
    torch.manual_seed(seed)
    cfg = {"mta_every": 1, "mta_query_kernel": 3, "mta_key_kernel": 5, "mta_head_group": 2,
           "mta_post_conv": False} | cfg
    attn = Attention(AttentionConfig(method=method, **cfg), n_head, n_head * head_dim, None, *layer).double()
    with torch.no_grad():
        for p in attn.processor.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return attn


def qkv(T, n_head=4, head_dim=8, B=2, seed=1):
    torch.manual_seed(seed)
    return [torch.randn(B, n_head, T, head_dim, dtype=torch.float64, requires_grad=True) for _ in range(3)]


def full(attn, q, k, v, backend, chunk=16):
    out, rem = (dense_attention(q, k, v, attn.parts) if backend == "dense"
                else chunked_attention(q, k, v, attn.parts, chunk))
    return attn.processor.finish(attn.normaliser.finish(out, rem, v))
