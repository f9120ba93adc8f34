"""RoPE context extension: each method's frequencies (and YaRN's temperature) against values
computed here independently, and the identity within the training length."""

import math

import pytest
import torch

from lenx.attention import Attention, AttentionConfig
from lenx.attention.rope import SCALINGS, RoPE

D, BASE, L_TRAIN = 64, 10000.0, 128


def theta(i, base=BASE, d=D):
    return base ** (-2 * i / d)


def freqs(scaling, factor, length):
    inv, mscale = RoPE(D, BASE, scaling, factor, L_TRAIN).frequencies(length)
    return inv.double(), mscale


def test_position_interpolation_divides_every_frequency():
    inv, mscale = freqs("pi", 4.0, 512)
    assert mscale == 1.0
    assert torch.allclose(inv, torch.tensor([theta(i) / 4 for i in range(D // 2)], dtype=torch.float64), rtol=1e-6)


def test_ntk_raises_the_base():
    inv, _ = freqs("ntk", 4.0, 512)
    base = BASE * 4.0 ** (D / (D - 2))
    assert torch.allclose(inv, torch.tensor([theta(i, base) for i in range(D // 2)], dtype=torch.float64), rtol=1e-6)
    # NTK-aware keeps the fastest dimension and interpolates the slowest one exactly by s
    assert inv[0] == 1.0 and math.isclose(inv[-1], theta(D // 2 - 1) / 4, rel_tol=1e-5)


def test_dynamic_ntk_follows_the_length():
    assert torch.equal(freqs("dynamic-ntk", 0, L_TRAIN)[0], freqs("none", 0, L_TRAIN)[0])
    assert torch.allclose(freqs("dynamic-ntk", 0, 4 * L_TRAIN)[0], freqs("ntk", 4.0, 0)[0])
    assert torch.allclose(freqs("dynamic-ntk", 7.0, 2 * L_TRAIN)[0], freqs("ntk", 2.0, 0)[0])  # the factor is ignored


def test_yarn_frequencies_and_temperature():
    s = 8.0
    inv, mscale = freqs("yarn", s, 1024)
    # the correction range, by hand: c(b) = d ln(L / (2 pi b)) / (2 ln base)
    low = max(0, math.floor(D * math.log(L_TRAIN / (2 * math.pi * 32)) / (2 * math.log(BASE))))
    high = min(D - 1, math.ceil(D * math.log(L_TRAIN / (2 * math.pi * 1)) / (2 * math.log(BASE))))
    assert (low, high) == (0, 11)
    expected = []
    for i in range(D // 2):
        ramp = min(1.0, max(0.0, (i - low) / (high - low)))
        expected.append(theta(i) / s * ramp + theta(i) * (1 - ramp))
    assert torch.allclose(inv, torch.tensor(expected, dtype=torch.float64), rtol=1e-6)
    assert math.isclose(mscale, 0.1 * math.log(8) + 1)
    # the temperature scales q and k, so every logit by its square
    rope = RoPE(D, BASE, "yarn", s, L_TRAIN)
    q = torch.randn(1, 1, 5, D)
    k = torch.randn(1, 1, 5, D)
    pos = torch.arange(5)
    qs, ks = rope(q, k, pos, length=1024)
    inv_t = inv.float()
    plain = RoPE(D, BASE)
    plain.inv_freq = inv_t
    qp, kp = plain(q, k, pos)
    assert torch.allclose(qs @ ks.transpose(-1, -2), (qp @ kp.transpose(-1, -2)) * mscale ** 2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_auto_factor_is_the_identity_within_the_training_length(scaling):
    for length in (1, 64, L_TRAIN):
        inv, mscale = freqs(scaling, 0.0, length)
        assert torch.equal(inv.float(), RoPE(D, BASE).inv_freq) and mscale == 1.0
    if scaling != "none":
        assert not torch.equal(freqs(scaling, 0.0, 4 * L_TRAIN)[0].float(), RoPE(D, BASE).inv_freq)


@pytest.mark.parametrize("method", ["rope", "dapev2-rope", "stickbreaking-rope"])
def test_every_rope_composition_takes_the_scaling(method):
    torch.manual_seed(0)
    plain = Attention(AttentionConfig(method=method), 2, 32).double()
    scaled = Attention(AttentionConfig(method=method, rope_scaling="yarn", rope_train_len=16), 2, 32).double()
    scaled.load_state_dict(plain.state_dict())
    x = torch.randn(1, 16, 32, dtype=torch.float64)
    assert torch.equal(scaled(x), plain(x))  # auto factor: identity at the training length
    x = torch.randn(1, 48, 32, dtype=torch.float64)
    assert not torch.allclose(scaled(x), plain(x))
    assert scaled.backend_for(torch.device("cpu")) == plain.backend_for(torch.device("cpu"))


def test_bad_scaling_settings():
    with pytest.raises(ValueError, match="unknown RoPE scaling"):
        RoPE(D, scaling="longrope", train_len=128)
    with pytest.raises(ValueError, match="training length"):
        RoPE(D, scaling="yarn")


def test_fine_tuned_runs_are_labelled_and_keep_their_scaling():
    from lenx.config import ConfigError, load_config
    from lenx.evaluation.evaluate import apply_rope_scaling, run_label

    plain = load_config("tiny")
    assert run_label(plain) is None
    tuned = load_config("tiny", ["model.rope_scaling=pi", "model.rope_scaling_factor=4.0", "model.rope_train_len=64"])
    assert run_label(tuned) == "rope+pi fine-tuned"
    with pytest.raises(ConfigError, match="trained with model.rope_scaling=pi"):
        apply_rope_scaling(tuned, "yarn", None)
    assert apply_rope_scaling(plain, "yarn", None)["train_len"] == 64
