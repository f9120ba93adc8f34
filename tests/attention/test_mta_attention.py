"""Multi-Token Attention (arXiv 2504.00927) as an attention part: the chunked path against the dense
one at odd lengths with blocks that cut inside the query halo (forward and backward), the identity
initialisation, the paper's configuration, causality, decoding a padded batch, the names, and bad
settings as one-line errors. The formula against explicit loops: tests/ops/test_mta.py."""

import pytest
import torch

from helpers import V, assert_close, model_for
from mta_helpers import attention, full, qkv
from lenx.attention import Attention
from lenx.attention.methods import UnknownMethodError, all_methods, parse_method
from lenx.attention.mta import MTA
from lenx.config import AttentionConfig, ConfigError, LMConfig, RunConfig
from lenx.model import LM
from lenx.model.checks import check_config


@pytest.mark.parametrize("method", ["mta", "mta-kerple"])
@pytest.mark.parametrize("T,chunk", [(1, 4), (63, 4), (63, 16), (111, 7), (111, 64)])
def test_chunked_is_dense_forward_and_backward(method, T, chunk):
    # c_q = 6: a halo of 5 rows, longer than a block of 4 and cut inside by blocks of 7 and 16
    attn = attention(method, mta_query_kernel=6, mta_key_kernel=11, mta_head_group=0, mta_head_mix="both")
    q, k, v = qkv(T)
    grad = torch.randn(2, 4, T, 8, dtype=torch.float64)
    outs, grads = [], []
    for backend in ("dense", "chunked"):
        out = full(attn, q, k, v, backend, chunk)
        params = [q, k, v, *attn.parameters()]
        grads.append(torch.autograd.grad(out, params, grad, allow_unused=True))
        outs.append(out.detach())
    assert_close(outs[1], outs[0], 1e-10, f"{method} T={T} chunk={chunk}")
    for i, (a, b) in enumerate(zip(*grads)):
        if a is None:
            assert b is None
            continue
        assert_close(b, a, 1e-9, f"{method} T={T} chunk={chunk}: gradient {i}", floor=1e-12)


def test_identity_initialisation_is_the_base_method():
    """Freshly built, the kernels and the mixing are identities: without the group norm MTA on a
    base gives the base's output exactly."""
    torch.manual_seed(0)
    mta = Attention(AttentionConfig(method="mta-kerple", mta_every=1, mta_head_mix="both", mta_group_norm=False), 4, 32)
    torch.manual_seed(0)
    base = Attention(AttentionConfig(method="kerple"), 4, 32)
    base.load_state_dict(mta.state_dict(), strict=False)
    p = mta.processor
    assert p.conv_kernel.shape == (4, 1, 6, 11) and p.conv_kernel.sum() == 4 and (p.conv_kernel[:, 0, -1, 5] == 1).all()
    assert torch.equal(p.pre_mix[0], torch.eye(4)) and torch.equal(p.post_mix[0], torch.eye(4))
    x = torch.randn(2, 23, 32)
    with torch.no_grad():
        assert_close(mta(x), base(x), 1e-6)


def test_paper_configuration():
    cfg = LMConfig(method="mta", n_layer=12, n_head=16, d_model=256)
    procs = [b.attn.processor for b in LM(cfg).blocks]
    assert [i for i, p in enumerate(procs) if p.conv_kernel is not None] == [2, 6, 10]  # every 4th layer
    for n_layer, convolved in [(1, [0]), (2, [1]), (3, [2])]:  # a model too shallow: its last layer
        blocks = LM(LMConfig(method="mta", n_layer=n_layer, n_head=4, d_model=32)).blocks
        assert [i for i, b in enumerate(blocks) if b.attn.processor.conv_kernel is not None] == convolved
    # the released configs: both kernels 6 x 11 on the convolved layers, all 16 heads mixed before and
    # after the softmax on every layer
    for p in procs:
        kernels = [p.conv_kernel, p.post_conv_kernel]
        assert all(k is None for k in kernels) or all(k.shape == (16, 1, 6, 11) for k in kernels)
        assert p.pre_mix.shape == p.post_mix.shape == (1, 16, 16)
    assert all(p.norm_weight is not None for p in procs)
    assert parse_method("mta").base == "rope" and parse_method("mta-rope").name == "mta"


def test_causal():
    """Changing a token leaves every earlier position's logits as they were (the query and key
    convolutions read no later key or query), and changes the later ones."""
    model = model_for("mta-kerple")
    idx = torch.randint(0, V, (1, 30))
    idx2 = idx.clone()
    idx2[0, 17] = (idx2[0, 17] + 1) % V
    with torch.no_grad():
        a, b = model(idx)[0], model(idx2)[0]
    assert torch.equal(a[:, :17], b[:, :17])
    assert not torch.allclose(a[:, 17:], b[:, 17:])


def test_decoding_with_a_padded_batch_is_each_prompt_alone():
    """Left-padded prompts of two lengths: each sequence's decoded logits are those of its own
    full forward (the cached queries of the padding read as zero rows), in float64, with head
    mixing both before and after the softmax."""
    model = model_for("mta-kerple", mta_head_mix="both")
    idx = torch.randint(0, V, (2, 20))
    with torch.no_grad():
        cache = model.new_cache(2, 20)
        assert cache.layers[0].q is not None
        first = model.prefill(idx[:, :12], cache, lengths=[12, 5])
        steps = [model.decode(idx[:, i:i + 1], cache)[:, 0] for i in range(12, 20)]
        for b, n in enumerate((12, 5)):
            seq = torch.cat([idx[b:b + 1, 12 - n:12], idx[b:b + 1, 12:]], 1)
            ref = model(seq)[0][0]
            assert_close(first[b], ref[n - 1], 1e-9, f"prefill {b}")
            assert_close(torch.stack([s[b] for s in steps]), ref[n:], 1e-9, f"decode {b}")


def test_names():
    names = all_methods()
    assert {"mta", "mta-kerple", "mta-alibi", "mta-nope", "mta-t5"} <= set(names)
    assert not any(n.startswith("mta") and "stickbreaking" in n for n in names)
    for bad, why in [("mta-stickbreaking-rope", "softmax"), ("mta-cope", "score processor"),
                     ("mta-dapev2-kerple", "unknown method")]:
        with pytest.raises(UnknownMethodError, match=why):
            parse_method(bad)
    assert parse_method("mta-kerple").causal_only


@pytest.mark.parametrize("key,value,words", [
    ("mta_key_kernel", 10, "odd"), ("mta_key_kernel", 0, "odd"), ("mta_query_kernel", 0, ">= 1"),
    ("mta_head_group", 3, "divisor"), ("mta_head_mix", "after", "one of"), ("mta_every", 0, ">= 1")])
def test_bad_settings_are_one_line_config_errors(key, value, words):
    cfg = RunConfig()
    cfg.model = LMConfig(method="mta", n_layer=2, n_head=4, d_model=32, **{key: value})
    with pytest.raises(ConfigError, match=words) as e:
        check_config(cfg)
    assert "\n" not in str(e.value) and f"model.{key}" in str(e.value)


def test_the_module_refuses_bad_values_too():
    with pytest.raises(ValueError, match="odd"):
        MTA(4, 8, key_kernel=4)
    with pytest.raises(ValueError, match="does not divide"):
        MTA(4, 8, head_group=3)


@pytest.mark.parametrize("decoding", ["eager", "static"])
def test_greedy_generation_is_the_argmax_of_the_full_forward(decoding):
    """Both decoders (LM.decode and the fixed-shape step a CUDA graph captures) read the cached
    queries of the rows before the new one: greedy tokens are those of full forwards."""
    from lenx.model.generate import generate

    model = model_for("mta-alibi", mta_head_mix="both")
    prompt = torch.randint(0, V, (2, 7))
    out = generate(model, [prompt[0], prompt[1, 3:]], 10, temperature=0, decoding=decoding)["tokens"]
    for b, p in enumerate((prompt[0], prompt[1, 3:])):
        seq = p[None]
        with torch.no_grad():
            for _ in range(10):
                seq = torch.cat([seq, model(seq)[0][:, -1].argmax(-1, keepdim=True)], 1)
        assert torch.equal(out[b], seq[0, len(p):]), (decoding, b)


def test_mta_on_fox_is_refused_in_one_line():
    """MTA's query halo needs earlier rows' biases, which FoX binds per decode step: refused, not wrong."""
    from lenx.attention.methods import UnknownMethodError, all_methods, parse_method

    with pytest.raises(UnknownMethodError, match="mta-fox is not supported"):
        parse_method("mta-fox")
    assert "mta-fox" not in all_methods() and "mta-kerple" in all_methods() and "dapev2-fox" in all_methods()
