"""lenx.ops.dape_v2.gluon (the Hopper Gluon forward) against the dense float reference. Skipped unless
CUDA on an sm_90 GPU and a triton whose Gluon API the kernel was written for (3.6); the CPU side
(weight layout, key permutation) runs everywhere."""

import pytest
import torch

from helpers import rel_err
from kernel_cases import GPU_T, batch_for, bias_table
from lenx.ops.dape_v2 import gluon as G
from lenx.ops.dape_v2.reference import dape_v2_reference


def test_key_permutation_gives_runs_of_16():
    """Column n = 8 m + 2 q + b of the accumulator holds key 16 q + 2 m + b: a bijection of 0..63, and
    lane q (the columns with (n >> 1) & 3 == q) holds exactly keys 16 q .. 16 q + 15."""
    keys = [G.key_of_column(n) for n in range(64)]
    assert sorted(keys) == list(range(64))
    for q in range(4):
        assert sorted(G.key_of_column(n) for n in range(64) if (n >> 1) & 3 == q) == list(range(16 * q, 16 * q + 16))


def test_tap_rows_put_a_channels_taps_in_one_thread():
    """tap_row is a bijection of (tap < 4, slot < 32) onto the 128 rows, and a channel's taps differ only
    in the row bits 3 and 6 (the accumulator's in-thread row bits)."""
    rows = {G.tap_row(t, c) for t in range(4) for c in range(32)}
    assert rows == set(range(128))
    for c in range(32):
        assert {G.tap_row(t, c) ^ G.tap_row(0, c) for t in range(4)} == {0, 8, 64, 72}


def _gluon_ready():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        return "needs an sm_90 GPU"
    if G._GLUON_ERROR is not None:
        return f"triton Gluon unavailable: {G._GLUON_ERROR!r}"
    return None


@pytest.mark.skipif(_gluon_ready() is not None, reason=str(_gluon_ready()))
@pytest.mark.parametrize("T", GPU_T)
@pytest.mark.parametrize("ks,kind", [(3, "kerple"), (3, None), (1, "alibi")])
def test_gpu_gluon_forward(T, ks, kind):
    H, d, D = 12, 64, 32
    B = batch_for(T)
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, d, device="cuda").to(torch.bfloat16) for _ in range(3))
    tab = bias_table(kind, H, T)
    tab = tab.detach() if tab is not None else None
    C = 2 * H if tab is not None else H
    w1 = torch.randn(D, C, 1, ks, device="cuda") * 0.3
    b1 = torch.randn(D, device="cuda") * 0.1
    w2 = torch.randn(H, D, 1, ks, device="cuda") * 0.3
    b2 = torch.randn(H, device="cuda") * 0.1
    o, lse = G.dape_v2_gluon_forward(q, k, v, w1, b1, w2, b2, tab)
    torch.cuda.synchronize()
    ref = dape_v2_reference(q.float(), k.float(), v.float(), w1, b1, w2, b2, tab)
    err = rel_err(o.float(), ref)
    assert torch.isfinite(o.float()).all() and torch.isfinite(lse).all()
    assert err < 1e-2, f"T {T} k {ks} {kind}: rel err {err:.3g}"
