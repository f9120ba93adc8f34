"""Shared test helpers."""

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-6) -> float:
    """|a - b| / |b|, with |b| floored: some exact gradients are zero (a softmax is blind to a
    per-row constant, e.g. DAPE's conv2 bias), and their rounding noise is not an error."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp(min=floor))


def assert_close(a, b, tol=1e-5, what="", floor=1e-6):
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert torch.isfinite(a).all(), f"{what}: non-finite values"
    err = rel_err(a, b, floor)
    assert err < tol, f"{what}: relative error {err:.2e} >= {tol:.0e}"
