"""lenx.ops.dape_v2.emulate: the planned Hopper forward kernel's tile schedule against the dense
reference, in fp64 (exact up to rounding), in its fp16/bf16 rounding mode, for causality, and its
pair permutation (the un-permutation must be a register rename)."""

import math

import pytest
import torch

from helpers import assert_close, rel_err
from kernel_cases import bias_table
from lenx.ops.biased_softmax.reference import table_bias
from lenx.ops.dape_v2.emulate import dape_v2_emulate, pair_permutation
from lenx.ops.dape_v2.reference import dape_v2_reference, dape_v2_scores


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def case(B, H, T, d, D, ks, kind, dtype=torch.float64, seed=0):
    """q, k, v, the conv weights and the bias table (None for kind None) of one shape."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, d, generator=g).to(dtype) for _ in range(3))
    C = 2 * H if kind else H
    w = (torch.randn(D, C, 1, ks, generator=g) * 0.3, torch.randn(D, generator=g) * 0.1,
         torch.randn(H, D, 1, ks, generator=g) * 0.3, torch.randn(H, generator=g) * 0.1)
    table = bias_table(kind, H, T)
    table = None if table is None else table.detach().cpu()  # a CPU test, also on GPU machines
    return q, k, v, tuple(x.double() for x in w), None if table is None else table.detach().double()


def reference_lse(q, k, w, table):
    """ln sum_j exp(A_ij) over the causal keys, from the dense processed scores."""
    T = q.shape[-2]
    pos = torch.arange(T)
    S = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    A = dape_v2_scores(S, None if table is None else table_bias(table, pos, pos), *w, pos, pos)
    return A.masked_fill(pos[None, :] > pos[:, None], float("-inf")).logsumexp(-1)


@pytest.mark.parametrize("T,H,d,D,ks,kind,block_m,block_n", [
    (1, 2, 8, 8, 3, "kerple", 32, 64),
    (1, 3, 16, 8, 1, None, 4, 16),
    (17, 2, 8, 8, 1, "alibi", 16, 16),
    (17, 16, 8, 16, 7, "kerple", 4, 16),  # 6-key lag in 16-key tiles
    (17, 3, 8, 8, 5, None, 2, 32),  # two rows per program: a 64-pair group spans both
    (63, 4, 16, 64, 5, None, 32, 64),
    (63, 12, 16, 32, 3, "kerple", 64, 32),
    (63, 2, 8, 8, 3, "kerple", 1, 64),  # one row per program
    (111, 5, 8, 16, 7, "alibi", 8, 128),
    (111, 3, 32, 8, 3, "t5", 128, 16),  # block_m > block_n: eight tiles cross the diagonal
    (111, 4, 8, 8, 7, "kerple", 32, 64),
    (40, 2, 8, 4, 19, "kerple", 16, 16),  # an 18-key lag longer than a tile: two flush tiles
    (1000, 2, 8, 8, 3, "kerple", 32, 64),
    (1000, 1, 4, 8, 5, None, 64, 128),
])
def test_matches_reference_fp64(T, H, d, D, ks, kind, block_m, block_n):
    B = 1 if T >= 1000 else 2  # the dense reference dominates the time
    q, k, v, w, table = case(B, H, T, d, D, ks, kind)
    o, lse = dape_v2_emulate(q, k, v, *w, table, block_m=block_m, block_n=block_n)
    assert o.dtype == torch.float64 and lse.shape == (B, H, T)
    assert_close(o, dape_v2_reference(q, k, v, *w, table), 1e-10, "out")
    assert_close(lse, reference_lse(q, k, w, table), 1e-10, "lse")


@pytest.mark.parametrize("ks,kind", [(3, "kerple"), (5, None)])
def test_causal(ks, kind):
    """Changing q, k, v after position t leaves every output row <= t as it was."""
    T, t = 50, 20
    q, k, v, w, table = case(1, 3, T, 8, 8, ks, kind)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, t + 1:] = torch.randn_like(x[:, :, t + 1:])
    a, la = dape_v2_emulate(q, k, v, *w, table, block_m=16, block_n=16)
    b, lb = dape_v2_emulate(q2, k2, v2, *w, table, block_m=16, block_n=16)
    assert torch.equal(a[:, :, : t + 1], b[:, :, : t + 1]) and torch.equal(la[..., : t + 1], lb[..., : t + 1])
    assert not torch.equal(a[:, :, t + 1:], b[:, :, t + 1:])


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ks,kind", [(3, "kerple"), (5, "alibi"), (3, None)])
def test_half_rounding(half, ks, kind):
    """bf16 inputs, conv operands in `half`, P in bf16: within bf16 error of the fp32 reference on
    the same inputs, and the conv rounding visibly happens (the lse moves off the reference only
    with it)."""
    q, k, v, w, table = case(2, 4, 111, 32, 16, ks, kind, dtype=torch.bfloat16)
    o, lse = dape_v2_emulate(q, k, v, *w, table, half=half)
    o32, lse32 = dape_v2_emulate(q, k, v, *w, table)
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32
    ref = dape_v2_reference(q.float(), k.float(), v.float(), *(x.float() for x in w),
                            None if table is None else table.float())
    ref_lse = reference_lse(q, k, w, table)
    assert rel_err(o, ref) < 1.5e-2 and rel_err(o32, ref) < 1e-2
    # without half only the output and P are rounded, which the lse does not see
    assert rel_err(lse32, ref_lse) < 1e-6 < rel_err(lse, ref_lse) < (4e-3 if half == torch.bfloat16 else 5e-4)


@pytest.mark.parametrize("n", [64, 128, 2048])
def test_pair_permutation(n):
    """A bijection; reading the accumulator columns a thread owns (quad position q of a group of
    64 columns: 8m + 2q + b, m = 0..7, b = 0, 1) in order gives 16 consecutive pairs, so the
    emulator's un-permutation (argsort) is exactly that register order."""
    perm = pair_permutation(n)
    assert torch.equal(perm.sort().values, torch.arange(n))
    owned = torch.tensor([[64 * g + 8 * m + 2 * q + b for m in range(8) for b in range(2)]
                          for g in range(n // 64) for q in range(4)])
    assert torch.equal(perm[owned], torch.arange(n).view(n // 16, 16))
    assert torch.equal(torch.argsort(perm).view(n // 16, 16), owned)


@pytest.mark.parametrize("block_m,block_n", [(4, 16), (2, 32), (32, 64), (1, 128)])
def test_runs_are_consecutive_keys_of_one_row(block_m, block_n):
    """Pairs are numbered (row, key) row-major, so every 16-pair run of a tile is 16 consecutive keys
    of one query row, also when a 64-pair group spans several rows (block_n < 64)."""
    runs = pair_permutation(block_m * block_n)[torch.argsort(pair_permutation(block_m * block_n))].view(-1, 16)
    row, key = runs // block_n, runs % block_n
    assert (row == row[:, :1]).all() and torch.equal(key - key[:, :1], torch.arange(16).expand_as(key))


def test_rejects_bad_blocks():
    q, k, v, w, table = case(1, 2, 9, 8, 4, 3, "kerple")
    for bm, bn in [(3, 64), (32, 48), (32, 8), (1, 16)]:
        with pytest.raises(ValueError, match="powers of two"):
            dape_v2_emulate(q, k, v, *w, table, block_m=bm, block_n=bn)
