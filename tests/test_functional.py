"""lenx.functional (also reachable as lenx.ops.*) against independent computations, on the
reference backends."""

import pytest
import torch

from helpers import assert_close, stick_loop
from lenx.attention import DapeV2, KerpleLog
from lenx.attention.backends import Parts, dense_attention
from lenx.attention.softmax import Softmax
from lenx.functional import dape_v2_attention, stickbreaking_attention


@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_stickbreaking_matches_product_loop(attend_current, backend):
    q, k, v = (torch.randn(1, 2, 19, 8, dtype=torch.float64) for _ in range(3))
    out, rem = stickbreaking_attention(q, k, v, attend_current=attend_current, backend=backend, chunk_size=5)
    ref_out, ref_rem = stick_loop(q, k, v, attend_current)
    assert_close(out, ref_out, 1e-12)
    assert_close(rem, ref_rem, 1e-12)
    if not attend_current:  # position 0 has no key: output 0, the whole stick left
        assert out[..., 0, :].abs().max() == 0 and (rem[..., 0] == 1).all()


def test_stickbreaking_extreme_logits_stay_finite():
    q = torch.randn(1, 1, 64, 16) * 30
    k = torch.randn(1, 1, 64, 16) * 30
    v = torch.randn(1, 1, 64, 16)
    for t in (q, k, v):
        t.requires_grad_(True)
    out, rem = stickbreaking_attention(q, k, v)
    (out.sum() + rem.sum()).backward()
    assert torch.isfinite(out).all() and torch.isfinite(rem).all()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("with_bias", [False, True])
def test_dape_v2_attention_matches_dense(with_bias):
    H, T = 3, 37
    q, k, v = (torch.randn(2, H, T, 8, dtype=torch.float64) for _ in range(3))
    proc = DapeV2(H, hidden=6, kernel_size=5, with_bias=with_bias).double()
    kerple = KerpleLog(H).double() if with_bias else None
    bias_map = kerple(torch.arange(T), torch.arange(T)) if with_bias else None
    ref, _ = dense_attention(q, k, v, Parts(kerple, proc, Softmax()))
    for backend in ("dense", "chunked"):
        out = dape_v2_attention(q, k, v, proc, bias_map, backend=backend, chunk_size=8)
        assert_close(out, ref, 1e-12, backend)
        out = dape_v2_attention(q, k, v, proc, kerple, backend=backend, chunk_size=8) if with_bias else out
        assert_close(out, ref, 1e-12, backend + " (bias module)")


def test_chunked_never_holds_more_than_a_block(monkeypatch):
    """The chunked path's score blocks are [B, H, chunk, <= T]: record every matmul's output size."""
    from lenx.attention.backends import reference

    seen = []
    real = reference.block_attention

    def spy(q, k, v, parts, *where):
        seen.append((q.shape[-2], k.shape[-2]))
        return real(q, k, v, parts, *where)

    monkeypatch.setattr(reference, "block_attention", spy)
    T, chunk = 100, 16
    q, k, v = (torch.randn(1, 2, T, 8) for _ in range(3))
    proc = DapeV2(2, hidden=4, kernel_size=3, with_bias=False)
    dape_v2_attention(q, k, v, proc, backend="chunked", chunk_size=chunk)
    assert max(r for r, _ in seen) <= chunk
    # keys stop at the block's causal edge plus the conv halo (k // 2)
    assert [c for _, c in seen] == [min(T, q0 + chunk + 1) for q0 in range(0, T, chunk)]


def test_old_import_paths_still_work():
    import lenx.ops

    assert lenx.ops.stickbreaking_attention is stickbreaking_attention
    assert lenx.ops.dape_v2_attention is dape_v2_attention
