"""lenx.ops.dape_v2.emulate_conv_bwd: K_C's schedule (the all-heads conv backward) on the CPU. In
float64 its dS and every weight and table gradient are autograd of reference.dape_v2_scores; with
the kernel's rounding points within stated bounds of float64; causal; blind to G's upper triangle;
the key-tile map owns every key once."""

import math

import pytest
import torch

from helpers import rel_err
from kernel_cases import bias_table
from lenx.ops.biased_softmax.reference import table_bias
from lenx.ops.dape_v2.emulate_conv_bwd import (conv_bwd_programs, conv_bwd_schedule, halo, input_grads,
                                               key_tiles, reduce_programs)
from lenx.ops.dape_v2.reference import dape_v2_scores

BF, FP = torch.bfloat16, torch.float16
# rounding points: the kernel's as proposed (fp16 scores, bf16 for everything G feeds), the brief's
# first guess (fp16 dY and Z too), and the skewed kernels' (all bf16: the GPU oracle)
KERNEL = dict(s_dtype=FP, z_dtype=BF, dy_dtype=BF, g_dtype=BF, ds_dtype=BF)
FP16_DY = dict(s_dtype=FP, z_dtype=FP, dy_dtype=FP, g_dtype=BF, ds_dtype=BF)
ALL_BF16 = dict(s_dtype=BF, z_dtype=BF, dy_dtype=BF, g_dtype=BF, ds_dtype=BF)
NAMES = ("dS", "dw1", "db1", "dw2", "db2", "dtable")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _case(T, H, D, ks, kind, d=16, seed=0):
    """q, k [1, H, T, d], a causal G, the conv weights (w1, b1, w2, b2) and the bias table, float64."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, H, T, d, generator=g, dtype=torch.float64) for _ in range(2))
    tab = bias_table(kind, H, T)
    tab = None if tab is None else tab.detach().double()
    C = 2 * H if tab is not None else H
    w = [torch.randn(D, C, 1, ks, generator=g) * 0.3, torch.randn(D, generator=g) * 0.1,
         torch.randn(H, D, 1, ks, generator=g) * 0.3, torch.randn(H, generator=g) * 0.1]
    G = torch.randn(1, H, T, T, generator=g, dtype=torch.float64).tril()
    return q, k, G, [x.double() for x in w], tab


def _reference(q, k, G, w, tab):
    """dS and (dw1, db1, dw2, db2, dtable) of sum(G * logits) by autograd of the dense reference."""
    T = q.shape[-2]
    pos = torch.arange(T)
    S = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).requires_grad_()
    leaves = [x.clone().requires_grad_() for x in w]
    t = None if tab is None else tab.clone().requires_grad_()
    A = dape_v2_scores(S, None if t is None else table_bias(t, pos, pos), *leaves, pos, pos)
    (A * G).sum().backward()
    return [S.grad] + [x.grad for x in leaves] + [None if t is None else t.grad]


def _emulated(q, k, G, w, tab, **kw):
    dS, grads = conv_bwd_schedule(q, k, G, w[0], w[1], w[2], tab, **kw)
    return [dS] + list(input_grads(grads, *w, tab))


def _errors(out, ref):
    return {n: rel_err(a, b) for n, a, b in zip(NAMES, out, ref) if b is not None}


@pytest.mark.parametrize("H", [1, 3, 12])
@pytest.mark.parametrize("ks", [1, 3, 5])
@pytest.mark.parametrize("T", [1, 2, 3, 17, 60, 61, 64, 65, 130])
def test_schedule_is_autograd_of_the_reference_fp64(T, ks, H):
    """dS and every gradient (score- and bias-channel weights of conv1, b1, w2, b2, the table) to 1e-10:
    T 1 is one tile; 60 / 61 / 64 / 65 straddle the owned width (60 at k 3) and the tile (64);
    T 130 five programs of 32 rows, up to three key tiles each. The table kind cycles with T (a
    Kerple-log table, ALiBi's, none)."""
    kind = ("kerple", "alibi", None)[[1, 2, 3, 17, 60, 61, 64, 65, 130].index(T) % 3]
    q, k, G, w, tab = _case(T, H, 5, ks, kind)
    errs = _errors(_emulated(q, k, G, w, tab), _reference(q, k, G, w, tab))
    assert len(errs) == (6 if kind else 5) and max(errs.values()) < 1e-10, errs


@pytest.mark.parametrize("block_m,block_n,ks,T", [(16, 64, 3, 97), (16, 32, 5, 97), (8, 16, 3, 97), (64, 64, 1, 97),
                                                  (32, 64, 5, 230)])
def test_other_tiles(block_m, block_n, ks, T):
    """The schedule does not depend on the review's 32 x 64 tiles: BM 16 (the smaller kernel), narrow
    tiles (16 keys own 12 at k 3, 32 own 24 at k 5), one program per 64 rows. T 230 at k 5: program 6's
    last row 223 is 1 before a tile edge (key 224), so only that tile holds dY at key 224 (past the
    diagonal, not 0): the first case at 32 x 64 tiles where owning keys up to the last row + h matters."""
    q, k, G, w, tab = _case(T, 3, 4, ks, "kerple", seed=1)
    errs = _errors(_emulated(q, k, G, w, tab, block_m=block_m, block_n=block_n), _reference(q, k, G, w, tab))
    assert max(errs.values()) < 1e-10, errs


def test_residual_is_exact_algebra():
    """dW2 from the residual hidden map plus the host's table part equals dW2 from Z itself (float64),
    with a large bias (Kerple-power: t1 in the hundreds)."""
    q, k, G, w, tab = _case(130, 3, 6, 3, "kerple-power", seed=2)
    a = conv_bwd_schedule(q, k, G, w[0], w[1], w[2], tab, residual=True)[1]["w2"]
    b = conv_bwd_schedule(q, k, G, w[0], w[1], w[2], tab, residual=False)[1]["w2"]
    assert rel_err(a, b) < 1e-12 and b.abs().max() > 1.0


def _bf16_case(kind, T=200, seed=0):
    """H 12, D 32, k 3, d 64, q and k in bf16 (the kernel's inputs), G rounded to bf16 once (as K_B1
    stores it): the float64 reference runs on exactly these values."""
    q, k, G, w, tab = _case(T, 12, 32, 3, kind, d=64, seed=seed)
    q, k = (x.to(BF).double() for x in (q, k))
    return q, k, G.to(BF).double(), w, tab


def _fp32(q, k, G, w, tab, scale=1.0, **kw):
    return _emulated(q.float(), k.float(), (G * scale).to(BF), [x.float() for x in w], tab.float(), **kw)


@pytest.mark.parametrize("kind", ["kerple", "alibi", "kerple-power"])
def test_rounding_points_bounds(kind):
    """Relative (Frobenius) errors against float64 on the same bf16 inputs at T 200 (measured: KERNEL
    dS 4.0-5.5e-3, dw1 1.9-5.3e-3, db1 2.9-6.7e-3, dw2 1.5-3.7e-4, dtable 3.6-5.0e-3; FP16_DY about
    the same at G of order 1; ALL_BF16 up to 1.7e-2, its bf16 scores dominating). Bounds: KERNEL
    1.5e-2 (dw2 2e-3), FP16_DY 2e-2, ALL_BF16 5e-2, and the bf16 scores cost ALL_BF16 at least 1.5x
    KERNEL's dS error (measured 2.0-3.1x)."""
    q, k, G, w, tab = _bf16_case(kind)
    ref = _reference(q, k, G, w, tab)
    err = {name: _errors(_fp32(q, k, G, w, tab, **cfg), ref)
           for name, cfg in (("kernel", KERNEL), ("fp16_dy", FP16_DY), ("bf16", ALL_BF16))}
    assert max(err["kernel"].values()) < 1.5e-2 and err["kernel"]["dw2"] < 2e-3, err["kernel"]
    assert max(err["fp16_dy"].values()) < 2e-2, err["fp16_dy"]
    assert max(err["bf16"].values()) < 5e-2 and err["bf16"]["dS"] > 1.5 * err["kernel"]["dS"], err


def test_residual_hidden_map_makes_dw2_accurate():
    """With the bias in the hidden map (ALiBi), rounding Z itself to bf16 costs dW2 several times the
    error of rounding its residual Z - LeakyReLU(t1) (measured 1.5e-3 against 1.5e-4 at T 200)."""
    q, k, G, w, tab = _bf16_case("alibi")
    ref = _reference(q, k, G, w, tab)[3]
    with_res = rel_err(_fp32(q, k, G, w, tab, **KERNEL)[3], ref)
    without = rel_err(_fp32(q, k, G, w, tab, residual=False, **KERNEL)[3], ref)
    assert with_res < without / 3, (with_res, without)


def test_gradient_scale():
    """G of a mean loss over N tokens is ~1 / (N T) (~1e-7 at 512 x 32): fp16 dY underflows there
    (relative errors 0.15 at G ~ 6e-8, 0.6 at 1.5e-8), while KERNEL's bf16 dY, Z and G scale exactly:
    G x 2^-26 gives every output x 2^-26, bit for bit."""
    q, k, G, w, tab = _bf16_case("kerple")
    s = 2.0 ** -26
    base = _fp32(q, k, G, w, tab, **KERNEL)
    small = _fp32(q, k, G, w, tab, scale=s, **KERNEL)
    assert all(torch.equal(a * s, b) for a, b in zip(base, small))
    ref = _reference(q, k, G * s, w, tab)
    assert rel_err(_fp32(q, k, G, w, tab, scale=s, **FP16_DY)[0], ref[0]) > 0.05


def test_causal_and_blind_to_the_upper_triangle():
    """dS rows up to t do not change when q, k and G change at later positions (every entry, also
    keys up to t + 2h inside the same tile), nor do the partial sums of the programs whose rows all
    precede t + 1; G above the diagonal is never read (NaN there changes nothing: K_C reads G from a
    tile-triangular buffer whose other half may hold anything)."""
    T, t = 130, 70
    q, k, G, w, tab = _case(T, 3, 4, 5, "alibi", seed=3)
    dS, part = conv_bwd_programs(q, k, G, w[0], w[1], w[2], tab)
    q2, k2, G2 = (x.clone() for x in (q, k, G))
    for x in (q2, k2):
        x[:, :, t + 1:] = torch.randn_like(x[:, :, t + 1:])
    G2[:, :, t + 1:] = torch.randn_like(G).tril()[:, :, t + 1:]
    dS2, part2 = conv_bwd_programs(q2, k2, G2, w[0], w[1], w[2], tab)
    assert torch.equal(dS[:, :, :t + 1], dS2[:, :, :t + 1]) and not torch.equal(dS, dS2)
    done = (t + 1) // 32  # programs 0 and 1 (rows 0-63)
    assert all(torch.equal(part[n][:, :done], part2[n][:, :done]) for n in ("w1s", "w2", "t1", "k0", "t2"))
    G3 = G + torch.full_like(G, float("nan")).triu(1)
    dS3, part3 = conv_bwd_programs(q, k, G3, w[0], w[1], w[2], tab)
    assert torch.equal(dS, dS3)
    assert all(torch.equal(part[n], part3[n]) for n in ("w1s", "w2", "t1", "k0", "t2"))


def test_reduction_is_in_program_order():
    """Two runs give the same bits, and the reduction is the programs' partials summed one after
    another in program order (its float32 rounding is that order's)."""
    q, k, G, w, tab = _case(130, 3, 4, 3, "kerple", seed=4)
    args = (q.float(), k.float(), G.float(), *(x.float() for x in w[:3]), tab.float())
    a, part = conv_bwd_programs(*args)
    b, grads = conv_bwd_schedule(*args)
    assert torch.equal(a, b)
    for name in ("w1s", "t1", "k0", "t2"):
        x = part[name].flatten(0, 1)
        seq = x[0].clone()
        for p in x[1:]:
            seq += p
        assert torch.equal(grads[name].reshape(seq.shape), seq), name
    assert all(torch.equal(reduce_programs(part)[n], grads[n]) for n in grads)


def test_halo_and_owned_width():
    """2 (k // 2) keys each side: 64 computed keys own 64, 60, 56 at k 1, 3, 5 (the review's 60 at
    k 3); even sizes and halos that leave no owned key are refused."""
    assert [halo(ks) for ks in (1, 3, 5, 7)] == [0, 2, 4, 6]
    for ks, owned in ((1, 64), (3, 60), (5, 56)):
        assert {hi - lo for _, lo, hi in key_tiles(0, 1000, ks, 32, 64)} == {owned}
    with pytest.raises(ValueError, match="odd kernel sizes"):
        key_tiles(0, 10, 4)
    with pytest.raises(ValueError, match="odd kernel sizes"):
        key_tiles(0, 10, 33, 32, 64)


@pytest.mark.parametrize("ks", [1, 3, 5])
@pytest.mark.parametrize("block_m,block_n", [(32, 64), (16, 64), (16, 32)])
def test_every_key_owned_by_exactly_one_tile(ks, block_m, block_n):
    """Per program: the owned ranges are disjoint and their union is exactly keys 0 .. last row + h
    (dY lives h keys past the diagonal), each tile computes its owned keys and their 2h-key halos,
    tiles come diagonal first (ws descending), and every program's tiles sit on the same grid."""
    h = ks // 2
    grid = set()
    for T in (1, 2, 3, 17, 60, 61, 64, 65, 130, 1000):
        for q0 in range(0, T, block_m):
            tiles = key_tiles(q0, T, ks, block_m, block_n)
            last = min(q0 + block_m, T) - 1
            owned = sorted(j for _, lo, hi in tiles for j in range(lo, hi))
            assert owned[0] == 0 and len(owned) == len(set(owned))
            assert set(range(last + h + 1)) <= set(owned) and max(lo for _, lo, _ in tiles) <= last + h
            assert all(ws <= lo - 2 * h and hi + 2 * h <= ws + block_n for ws, lo, hi in tiles)
            assert [ws for ws, _, _ in tiles] == sorted((ws for ws, _, _ in tiles), reverse=True)
            grid |= {(ws + 2 * h) % (block_n - 4 * h) for ws, _, _ in tiles}
    assert grid == {0}
