"""Partial RoPE (p-RoPE, model.rope_fraction): the first p d dims of each head rotated with the p d / 2
highest frequencies, the rest passed through; against a float64 rotation written out pair by pair,
with the scalings, in decoding (float64) and through the config checks."""

import math

import pytest
import torch

from helpers import V, assert_close, model_for
from lenx.attention.rope import RoPE
from lenx.config import ConfigError, LMConfig, RunConfig
from lenx.model import check_config

D, BASE = 16, 10000.0


def rotated_by_hand(x: torch.Tensor, pos: torch.Tensor, rotary: int) -> torch.Tensor:
    """float64: pair (i, i + rotary/2) of the first `rotary` dims turned by pos * BASE^(-2i/D)."""
    out = x.double().clone()
    half = rotary // 2
    for i in range(half):
        angle = pos.double() * BASE ** (-2 * i / D)
        a, b = x[..., i].double(), x[..., i + half].double()
        out[..., i] = a * angle.cos() - b * angle.sin()
        out[..., i + half] = b * angle.cos() + a * angle.sin()
    return out


@pytest.mark.parametrize("fraction", [0.125, 0.25, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("T", [1, 63, 111])
def test_the_first_dims_turn_and_the_rest_pass(fraction, T):
    rope = RoPE(D, BASE, fraction=fraction)
    rotary = round(fraction * D)
    assert rope.rotary == rotary and rope.inv_freq.shape == (rotary // 2,)
    q, k = torch.randn(2, 3, T, D, dtype=torch.float64), torch.randn(2, 3, T, D, dtype=torch.float64)
    pos = torch.arange(T)
    rq, rk = rope(q, k, pos)
    assert_close(rq, rotated_by_hand(q, pos, rotary), 1e-6, "q")
    assert_close(rk, rotated_by_hand(k, pos, rotary), 1e-6, "k")
    assert torch.equal(rq[..., rotary:], q[..., rotary:])  # unrotated dims: the very same numbers
    # the decoding form (signed table) gives the same bits
    cos, sin = rope.step_table(pos, dtype=q.dtype)
    assert torch.equal(RoPE.rotate_signed(q, cos, sin), rq)


def test_the_frequencies_are_the_highest_of_the_whole_head():
    """p-RoPE keeps the full head's frequencies and drops the lowest; the scalings scale them the same."""
    for scaling, extra in (("none", {}), ("pi", {"factor": 4.0, "train_len": 64}), ("ntk", {"factor": 4.0, "train_len": 64}),
                           ("yarn", {"factor": 4.0, "train_len": 64})):
        full = RoPE(D, BASE, scaling, **extra).frequencies(256)
        part = RoPE(D, BASE, scaling, fraction=0.5, **extra).frequencies(256)
        assert torch.equal(part[0], full[0][:D // 4]) and part[1] == full[1], scaling
    full = RoPE(D, BASE, "dynamic-ntk", train_len=64).frequencies(torch.tensor([32, 256]))
    part = RoPE(D, BASE, "dynamic-ntk", train_len=64, fraction=0.25).frequencies(torch.tensor([32, 256]))
    assert torch.equal(part[0], full[0][..., :D // 8])


def test_scores_depend_on_the_distance_only():
    rope = RoPE(D, BASE, fraction=0.5)
    q, k = torch.randn(1, 1, 1, D, dtype=torch.float64), torch.randn(1, 1, 1, D, dtype=torch.float64)

    def score(i, j):
        rq, _ = rope(q, q, torch.tensor([i]))
        rk, _ = rope(k, k, torch.tensor([j]))
        return float((rq * rk).sum())

    assert math.isclose(score(10, 3), score(107, 100), rel_tol=1e-5)
    assert not math.isclose(score(10, 3), score(10, 4), rel_tol=1e-3)


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5, 0.3, 1 / 16])
def test_a_bad_fraction_is_refused(fraction):
    with pytest.raises(ValueError, match="even number of dims"):
        RoPE(D, fraction=fraction)


@pytest.mark.parametrize("model, needles", [
    ({"rope_fraction": 0.0}, ["model.rope_fraction must be in (0, 1]"]),
    ({"rope_fraction": 1.25}, ["model.rope_fraction must be in (0, 1]"]),
    ({"rope_fraction": 0.3}, ["model.rope_fraction", "head dimension 32", "even number"]),
    ({"rope_fraction": 0.5, "method": "kerple"}, ["model.rope_fraction applies to RoPE layers", "kerple"]),
])
def test_the_config_check_is_one_line(model, needles):
    cfg = RunConfig()
    cfg.model = LMConfig(**({"n_layer": 2, "n_head": 4, "d_model": 128} | model))
    with pytest.raises(ConfigError) as e:
        check_config(cfg)
    assert "\n" not in str(e.value) and all(n in str(e.value) for n in needles), str(e.value)


# fixed factors: a scale that follows the length keeps the cached keys' rotation (Attention.extend)
@pytest.mark.parametrize("scaling", [{}, {"rope_scaling": "ntk", "rope_scaling_factor": 2.0, "rope_train_len": 8},
                                     {"rope_scaling": "yarn", "rope_scaling_factor": 4.0, "rope_train_len": 8}])
def test_decoding_with_partial_rope_equals_the_full_forward(scaling):
    model = model_for("rope", rope_fraction=0.5, **scaling)
    assert model.blocks[0].attn.rope.rotary == 4
    T = 20
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = model.new_cache(2, T)
        steps = [model.prefill(idx[:, :3], cache)] + [model.decode(idx[:, i:i + 1], cache)[:, 0] for i in range(3, T)]
        want = [model(idx[:, :i + 1])[0][:, -1] for i in range(2, T)]
    for i, (a, b) in enumerate(zip(steps, want)):
        assert_close(a, b, 1e-9, f"step {i}")


def test_a_fraction_changes_the_model():
    """Not a setting that is read and ignored: the same weights give other logits."""
    full, part = model_for("rope"), model_for("rope", rope_fraction=0.25)
    idx = torch.randint(0, V, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.allclose(full(idx)[0], part(idx)[0])
