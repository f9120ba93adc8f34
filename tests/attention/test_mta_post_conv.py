"""MTA's post-softmax key-query convolution (model.mta_post_conv, the released configs' second 6 x 11
kernel): the tensor form against the loops, the chunked path against the dense one with blocks cut
inside the grown query halo (forward and backward), the identity initialisation, the released
configuration's layers, causality, decoding = the full forward (float64) and bad settings as
one-line errors."""

import pytest
import torch

from helpers import V, assert_close, model_for
from mta_helpers import attention, full, qkv
from lenx.attention import Attention
from lenx.attention.mta import MTA
from lenx.config import AttentionConfig, ConfigError, LMConfig, RunConfig
from lenx.model import LM
from lenx.model.checks import check_config
from lenx.ops.mta.reference import mta_loops, mta_probs

POST = dict(mta_post_conv=True, mta_post_query_kernel=3, mta_post_key_kernel=3)


@pytest.mark.parametrize("mix", ["none", "post", "both"])
@pytest.mark.parametrize("T", [1, 7, 12])
def test_tensor_form_is_the_loops(T, mix):
    attn = attention("mta-alibi", mta_head_mix=mix, **POST)
    p = attn.processor
    assert p.post_conv_kernel.shape == (4, 1, 3, 3) and p.post_halo == 2 and p.q_halo == 2 + 2
    q, k, v = qkv(T)
    pos = torch.arange(T)
    want = mta_loops(q, k, v, p.conv_kernel, p.pre_mix, p.post_mix, attn.bias(pos, pos),
                     (p.norm_weight, p.gate.weight[0], p.gate.bias), p.post_conv_kernel)
    assert_close(full(attn, q, k, v, "dense"), want, 1e-10, f"dense T={T} {mix}")
    for chunk in (1, 3, 5):  # blocks shorter than the halo of 4, and one that cuts inside it
        assert_close(full(attn, q, k, v, "chunked", chunk=chunk), want, 1e-10, f"chunked {chunk} T={T} {mix}")


def test_the_convolution_spreads_onto_future_keys_and_mask_0_removes_it():
    """Without the mask after it, a post-softmax convolution centred on each key puts weight on keys
    after the row's query (entry (i, i + 1) reads key i): Mask_0 leaves only j <= i."""
    probs = torch.tril(torch.rand(1, 1, 5, 5, dtype=torch.float64))
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    kernel = torch.rand(1, 1, 2, 3, dtype=torch.float64)
    out = mta_probs(probs, allowed, kernel)
    assert (out[..., ~allowed] == 0).all() and (out[..., allowed] != 0).all()
    assert torch.equal(mta_probs(probs, allowed, kernel, context=2), out[..., 2:, :])


@pytest.mark.parametrize("method", ["mta", "mta-kerple"])
@pytest.mark.parametrize("T,chunk", [(1, 4), (63, 4), (63, 16), (111, 7), (111, 64)])
def test_chunked_is_dense_forward_and_backward(method, T, chunk):
    # both kernels 6 x 11: a halo of 5 + 5 rows, longer than a block of 4 and 7, cut inside by 16
    attn = attention(method, mta_query_kernel=6, mta_key_kernel=11, mta_head_group=0, mta_head_mix="both",
                     mta_post_conv=True)
    assert attn.processor.q_halo == 10 and attn.processor.post_halo == 5
    q, k, v = qkv(T)
    grad = torch.randn(2, 4, T, 8, dtype=torch.float64)
    outs, grads = [], []
    for backend in ("dense", "chunked"):
        out = full(attn, q, k, v, backend, chunk)
        grads.append(torch.autograd.grad(out, [q, k, v, *attn.parameters()], grad, allow_unused=True))
        outs.append(out.detach())
    assert_close(outs[1], outs[0], 1e-10, f"{method} T={T} chunk={chunk}")
    for i, (a, b) in enumerate(zip(*grads)):
        assert (a is None) == (b is None), i
        if a is not None:
            assert_close(b, a, 1e-9, f"{method} T={T} chunk={chunk}: gradient {i}", floor=1e-12)
    kernel_grad = grads[0][3 + [n for n, _ in attn.named_parameters()].index("processor.post_conv_kernel")]
    assert T == 1 or kernel_grad.abs().sum() > 0  # the post-softmax kernel learns


def test_identity_initialisation_is_the_base_method():
    """Freshly built, the post-softmax kernel is the identity too (a 1 at the row's own query and the
    key's own column, as the released code initialises it): without the group norm MTA with both
    convolutions on a base gives the base's output."""
    torch.manual_seed(0)
    mta = Attention(AttentionConfig(method="mta-kerple", mta_every=1, mta_head_mix="both", mta_group_norm=False,
                                    mta_post_conv=True), 4, 32)
    torch.manual_seed(0)
    base = Attention(AttentionConfig(method="kerple"), 4, 32)
    base.load_state_dict(mta.state_dict(), strict=False)
    k = mta.processor.post_conv_kernel
    assert k.shape == (4, 1, 6, 11) and k.sum() == 4 and (k[:, 0, -1, 5] == 1).all() and k.requires_grad
    x = torch.randn(2, 23, 32)
    with torch.no_grad():
        assert_close(mta(x), base(x), 1e-6)


def test_released_configuration_layers():
    """The post-softmax convolution sits on the layers of the pre-softmax one (every 4th), 6 x 11, on
    by default (the released configs); off, a model has no parameters of it (runs saved before it)."""
    procs = [b.attn.processor for b in LM(LMConfig(method="mta", n_layer=12, n_head=16, d_model=256)).blocks]
    assert [i for i, p in enumerate(procs) if p.post_conv_kernel is not None] == [2, 6, 10]
    assert all((p.post_conv_kernel is None) == (p.conv_kernel is None) for p in procs)
    assert procs[2].post_conv_kernel.shape == (16, 1, 6, 11) and procs[2].q_halo == 10 and procs[0].q_halo == 0
    plain = LM(LMConfig(method="mta", n_layer=4, n_head=4, d_model=32, mta_post_conv=False)).state_dict()
    assert not any("post_conv" in name for name in plain)


def test_causal():
    model = model_for("mta-kerple", mta_head_mix="both", mta_post_conv=True)
    idx = torch.randint(0, V, (1, 30))
    idx2 = idx.clone()
    idx2[0, 17] = (idx2[0, 17] + 1) % V
    with torch.no_grad():
        a, b = model(idx)[0], model(idx2)[0]
    assert torch.equal(a[:, :17], b[:, :17])
    assert not torch.allclose(a[:, 17:], b[:, 17:])


def test_decoding_with_a_padded_batch_is_each_prompt_alone():
    """Each decode step recomputes the probabilities of the c_q' - 1 rows above it from the cached
    queries (and their scores from the c_q - 1 rows above those): a left-padded batch decodes each
    sequence's full forward, in float64."""
    model = model_for("mta-kerple", mta_head_mix="both", mta_post_conv=True)
    idx = torch.randint(0, V, (2, 24))
    with torch.no_grad():
        cache = model.new_cache(2, 24)
        first = model.prefill(idx[:, :12], cache, lengths=[12, 5])
        steps = [model.decode(idx[:, i:i + 1], cache)[:, 0] for i in range(12, 24)]
        for b, n in enumerate((12, 5)):
            seq = torch.cat([idx[b:b + 1, 12 - n:12], idx[b:b + 1, 12:]], 1)
            ref = model(seq)[0][0]
            assert_close(first[b], ref[n - 1], 1e-9, f"prefill {b}")
            assert_close(torch.stack([s[b] for s in steps]), ref[n:], 1e-9, f"decode {b}")


@pytest.mark.parametrize("decoding", ["eager", "static"])
def test_greedy_generation_is_the_argmax_of_the_full_forward(decoding):
    from lenx.model.generate import generate

    model = model_for("mta-alibi", mta_head_mix="both", mta_post_conv=True, mta_post_query_kernel=4)
    prompt = torch.randint(0, V, (2, 7))
    out = generate(model, [prompt[0], prompt[1, 3:]], 10, temperature=0, decoding=decoding)["tokens"]
    for b, p in enumerate((prompt[0], prompt[1, 3:])):
        seq = p[None]
        with torch.no_grad():
            for _ in range(10):
                seq = torch.cat([seq, model(seq)[0][:, -1].argmax(-1, keepdim=True)], 1)
        assert torch.equal(out[b], seq[0, len(p):]), (decoding, b)


@pytest.mark.parametrize("key,value,words", [
    ("mta_post_key_kernel", 10, "odd"), ("mta_post_key_kernel", 0, "odd"), ("mta_post_query_kernel", 0, ">= 1")])
def test_bad_settings_are_one_line_config_errors(key, value, words):
    cfg = RunConfig()
    cfg.model = LMConfig(method="mta", n_layer=2, n_head=4, d_model=32, mta_post_conv=True, **{key: value})
    with pytest.raises(ConfigError, match=words) as e:
        check_config(cfg)
    assert "\n" not in str(e.value) and f"model.{key}" in str(e.value)


def test_the_module_refuses_bad_values_too():
    with pytest.raises(ValueError, match="post-softmax key kernel must be an odd"):
        MTA(4, 8, post_kernel=(6, 4))
    with pytest.raises(ValueError, match="post-softmax query kernel must be >= 1"):
        MTA(4, 8, post_kernel=(0, 11))
