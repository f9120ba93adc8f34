"""DAPE V2 at a sequence's end, as lenx defines it (the paper's appendix L and the authors' code do
the same; notes/next.md, "DAPE V2 at the sequence's end"). tril zeroes conv1's INPUT past the
diagonal, not its output: inside the sequence conv1's output at a key past row r is
leaky(b1 + the taps that reach keys <= r), while past the sequence's end it is conv2's zero padding.
So with k > 1 row r of a forward over T > r + k // 2 tokens (the "full form", what training and
perplexity see at all but a window's last rows) differs from the last row of a forward over r + 1
tokens (the "prefix form", what decoding gives), by conv2's taps on those k // 2 hidden keys alone.
These tests pin that definition; they change if the definition does."""

import pytest
import torch
from torch.nn import functional as F

from helpers import V, assert_close, model_for
from lenx.ops.dape_v2.reference import dape_v2_scores


def weights(H, D, k):
    torch.manual_seed(5)
    return (torch.randn(D, 2 * H, 1, k, dtype=torch.float64) * 0.4, torch.randn(D, dtype=torch.float64) * 0.5,
            torch.randn(H, D, 1, k, dtype=torch.float64) * 0.4, torch.randn(H, dtype=torch.float64) * 0.1)


def end_gap_by_hand(x, r, T, w1, b1, w2):
    """[H, r + 1]: row r's conv2 taps on the hidden keys u in (r, min(T - 1, r + k // 2)], which exist
    in a T-key map and are padding in an (r + 1)-key one. x [C, Tk]: row r's conv input, zero past r."""
    half = w1.shape[-1] // 2
    gap = torch.zeros(w2.shape[0], r + 1, dtype=x.dtype)
    for u in range(r + 1, min(T - 1, r + half) + 1):
        y = b1.clone()
        for t in range(w1.shape[-1]):
            if 0 <= u + t - half <= r:  # conv1's input is row r's tril'd input: nothing past key r
                y = y + w1[:, :, 0, t] @ x[:, u + t - half]
        hidden = F.leaky_relu(y, 0.01)
        for j in range(r + 1):
            t = u - j + half  # conv2's output at key j reads the hidden key u through tap t
            if 0 <= t < w2.shape[-1]:
                gap[:, j] += w2[:, :, 0, t] @ hidden
    return gap


@pytest.mark.parametrize("k", [1, 3, 5])
def test_a_rows_last_keys_differ_by_conv2_on_the_hidden_keys_past_it(k):
    H, D, T = 3, 4, 9
    w1, b1, w2, b2 = weights(H, D, k)
    S = torch.randn(1, H, T, T, dtype=torch.float64)
    bias = torch.randn(1, H, T, T, dtype=torch.float64)
    full = dape_v2_scores(S, bias, w1, b1, w2, b2)
    for r in range(T):
        last = dape_v2_scores(S[:, :, r:r + 1, :r + 1], bias[:, :, r:r + 1, :r + 1], w1, b1, w2, b2)[0, :, 0]
        x = torch.cat([S[0, :, r], bias[0, :, r]]).clone()
        x[:, r + 1:] = 0.0
        gap = end_gap_by_hand(x, r, T, w1, b1, w2)
        assert_close(full[0, :, r, :r + 1] - last, gap, 1e-12, f"k {k} row {r}", floor=1.0)
        if k == 1 or r == T - 1:  # no hidden key past r, or none inside the map
            assert gap.abs().max() == 0
        else:  # the keys within k // 2 of the diagonal move, by more than rounding; the others not at all
            near = max(0, r + 1 - k // 2)
            assert gap[:, near:].abs().max() > 1e-3
            assert (gap[:, :near] == 0).all()


@pytest.mark.parametrize("method,k", [("dapev2-kerple", 3), ("dapev2-nope", 5), ("dapev2-kerple", 1)])
def test_the_model_row_depends_on_whether_the_sequence_goes_on(method, k):
    """Row r of a long forward: the same for every length past r + k // 2 and for any tokens after r
    (no leak), but not the last row of the forward over r + 1 tokens unless k = 1. Decoding gives
    that last row (tests/model/test_decode.py), so with k > 1 a decoded step is not the
    teacher-forced row of the same position."""
    model = model_for(method, dape_kernel=k)
    half, T = k // 2, 12
    idx = torch.randint(0, V, (2, T))
    other = torch.randint(0, V, (2, T))
    with torch.no_grad():
        full = model(idx)[0]
        for r in range(T - half - 1):
            covered = model(idx[:, :r + 1 + half])[0][:, r]
            assert_close(covered, full[:, r], 1e-12, f"{method} k {k} row {r}, {r + 1 + half} tokens")
            future = torch.cat([idx[:, :r + 1], other[:, r + 1:]], 1)
            assert_close(model(future)[0][:, r], full[:, r], 1e-12, f"{method} row {r}: other tokens after it")
            last = model(idx[:, :r + 1])[0][:, -1]
            gap = float((last - full[:, r]).abs().max())
            if k == 1 or r == 0:  # row 0 has one key: its scores do not matter to the softmax
                assert gap < 1e-12, (method, r, gap)
            else:
                assert gap > 1e-3, (method, k, r, gap)
