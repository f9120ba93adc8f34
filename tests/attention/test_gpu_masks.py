"""CUDA checks of the window and document masks on the PyTorch backends (compiled FlexAttention's
block mask, SDPA's boolean mask) and what auto picks (the fused kernels for kerple, t5,
stick-breaking and DAPE V2) against dense, forward and backward (run on the device; skipped without CUDA)."""

import copy

import pytest
import torch

from helpers import assert_close
from lenx.attention import Attention, AttentionConfig

pytestmark = pytest.mark.gpu


def segments(B, T):
    """Documents of lengths 1, 2, 3, ... (one of length 1 first), per row shifted."""
    ids = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        doc, left = 0, 1 + b
        for t in range(T):
            ids[b, t] = doc
            left -= 1
            if left == 0:
                doc += 1
                left = doc + 1
    return ids.cuda()


@pytest.mark.parametrize("method,backend", [("kerple", "flex"), ("alibi", "flex"), ("nope", "flex"), ("rope", "sdpa"),
                                            ("kerple", "auto"), ("t5", "auto"), ("dapev2-kerple", "auto"),
                                            ("stickbreaking", "auto")])
@pytest.mark.parametrize("T,window", [(1, 1), (63, 62), (111, 17), (256, 1), (256, 300)])
@pytest.mark.parametrize("docs", [False, True])
def test_masked_backends_match_dense(method, backend, T, window, docs):
    ref = Attention(AttentionConfig(method=method, backend="dense", window=window), 2, 64).cuda()
    fast = copy.deepcopy(ref)
    fast.cfg = AttentionConfig(method=method, backend=backend, window=window)
    seg = segments(2, T) if docs else None
    x = torch.randn(2, T, 64, device="cuda", requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y_ref, y = ref(x, segments=seg), fast(x2, segments=seg)
    assert_close(y, y_ref, 1e-4, "forward")
    g = torch.randn_like(y)
    y_ref.backward(g)
    y.backward(g)
    assert_close(x2.grad, x.grad, 1e-4, "dx", floor=1e-3)
