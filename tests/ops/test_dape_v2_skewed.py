"""lenx.ops.dape_v2.skewed (the training kernels over T x T buffers) against the dense reference:
the output and every gradient (q, k, v, the bias table, both convs' weights and biases), the
buffers themselves (the index maps), causality, bitwise repeatability and the buffer sizes.
Without CUDA the kernels run under Triton's interpreter (fp32 and fp16); the gpu tests add bf16
up to T = 4096 and a 125m training run against the chunked reference path."""

import functools
import math

import pytest
import torch

from helpers import assert_close
from kernel_cases import CUDA, DEVICE, GPU_T, batch_for, bias_table, bounds_checked, causal_gap
from lenx.ops.biased_softmax.reference import table_bias
from lenx.ops.dape_v2.reference import dape_v2_scores, dape_v2_tables
from test_dape_v2_large_bias import causal_entries, flash_bias, row_starts
from test_dape_v2 import conv_weights, run_dape

pytest.importorskip("triton")
from lenx.ops.dape_v2 import skewed  # noqa: E402


def recompute(q, k, v, w1, b1, w2, b2, table):
    """The skewed path with the buffers recomputed in the backward (the memory setting)."""
    return skewed.dape_v2_skewed(q, k, v, w1, b1, w2, b2, table, keep=False)


# T, H, d, k, D, bias: T over {1, 2, 3, 17, 64, 130} (one tile, tile edges, several bands and row
# blocks), H over {1, 3, 12}, k over {1, 3, 5, 7}, D from 8 to 32, with and without a bias table.
CASES = [
    (1, 3, 16, 3, 8, "kerple"),
    (2, 1, 16, 3, 8, "alibi"),
    (3, 3, 16, 5, 8, None),
    (17, 3, 16, 7, 8, "kerple"),
    (17, 12, 16, 3, 32, "kerple"),
    (64, 3, 32, 1, 16, "alibi"),
    (64, 1, 64, 3, 8, None),
    (130, 3, 16, 3, 8, "kerple"),
    (40, 2, 16, 5, 8, "t5"),
]


@pytest.mark.parametrize("T,H,d,ks,D,kind", CASES)
def test_skewed_fp32(T, H, d, ks, D, kind):
    run_dape(2 if T < 100 else 1, H, T, d, ks, D, kind, torch.float32, op=skewed.dape_v2_skewed)


@pytest.mark.parametrize("T,H,d,ks,D,kind", [(17, 3, 16, 3, 8, "kerple"), (64, 12, 16, 3, 32, "kerple"),
                                             (33, 2, 32, 7, 8, None), (21, 2, 128, 3, 8, "alibi")])
def test_skewed_fp16(T, H, d, ks, D, kind):
    run_dape(1, H, T, d, ks, D, kind, torch.float16, op=skewed.dape_v2_skewed)


@pytest.mark.parametrize("T,ks,kind", [(1, 3, "kerple"), (37, 3, "kerple"), (20, 5, None)])
def test_skewed_head_dim_128(T, ks, kind):
    """d = 128, which the O(T) kernel cannot take (the backend routes it here): one head's q and k
    tiles at a time."""
    run_dape(1, 2, T, 128, ks, 8, kind, torch.float32, op=skewed.dape_v2_skewed)


# small tiles: many bands and row blocks (and a partial last band) in a short sequence
TINY = {"conv_z": (2, 16, 4, 1), "conv_f": (4, 16, 4, 1), "conv_dy": (2, 16, 4, 1), "conv_dx": (4, 16, 4, 1),
        "attn_fwd": (16, 16, 4, 1), "attn_bwd": (16, 16, 4, 1), "dq": (16, 16, 4, 1), "dk": (16, 16, 4, 1),
        "scores": (16, 16, 4, 1)}


def test_skewed_recompute_and_small_tiles():
    """keep=False recomputes the buffers in the backward; small tiles put many bands and row blocks
    (and a partial last band) into a short sequence."""
    run_dape(2, 3, 45, 16, 3, 8, "kerple", torch.float32, op=recompute)

    def small(q, k, v, w1, b1, w2, b2, table):
        return skewed.dape_v2_skewed(q, k, v, w1, b1, w2, b2, table, config=TINY)

    run_dape(1, 3, 45, 16, 5, 8, "alibi", torch.float32, op=small)


@pytest.mark.parametrize("ks,residual", [(1, True), (3, True), (5, True), (3, False), (5, False)])
def test_buffers_hold_scores_and_residual_logits(ks, residual):
    """The index maps: the S buffer is Q K^T / sqrt(d) at (b, pair, slot h), its padded slots zero,
    and the F buffer conv2(...) without its bias (with the residual: less the residual table g[h, i
    - j] and the edge term e0 at keys < 2h) at (b, h, pair), a pair (i, j <= i) at key j of packed
    row i (rows of 8 ceil((i + 1) / 8) entries), for a sequence that spans several bands."""
    B, H, T, d, D = 2, 3, 41, 16, 8
    q, k = (torch.randn(B, H, T, d, device=DEVICE) for _ in range(2))
    w1, b1, w2, b2 = (x.to(DEVICE).float() for x in conv_weights(H, D, ks, True))
    table = torch.randn(H, 2 * T - 1, device=DEVICE)
    t1, k0, t2 = dape_v2_tables(w1, b1, b2, table, T)
    cfg = dict(skewed.CONFIG_FP32, conv_z=(2, 16, 4, 1), conv_f=(2, 16, 4, 1))
    sb = skewed._scores_buffer(q, k, cfg)
    fb = skewed._conv_buffer(sb, skewed._Weights(w1[:, :H], t1, k0, w2, q.dtype), cfg, residual)
    pos = torch.arange(T, device=DEVICE)
    causal = pos[None, :] <= pos[:, None]
    S = q @ k.transpose(-1, -2) / math.sqrt(d)
    bias = table_bias(table, pos, pos)
    f = dape_v2_scores(S, bias, w1, b1, w2, b2, pos, pos) - S - bias - b2[:, None, None]
    t2f, e0 = skewed.flash_tables(t1, k0, w2, t2, residual)  # F - g - e0: the sum is what the flash kernels add
    f = f - (flash_bias(t2f, e0, T) - table_bias(t2, pos, pos))
    P, at = row_starts(T)[-1].item(), causal_entries(T).to(DEVICE)
    assert sb.shape == (B, P, 16) and fb.shape == (B, H, P)
    assert_close(sb[:, at, :H].permute(0, 2, 1), S[..., causal], 1e-6, "S buffer")
    assert torch.equal(sb[:, at, H:], torch.zeros_like(sb[:, at, H:]))
    assert_close(fb[..., at], f[..., causal], 1e-5, "F buffer")


def forced(residual):
    """dape_v2_skewed with F's residual forced on or off (the switch otherwise decides from the tables)."""
    return functools.partial(skewed.dape_v2_skewed, residual=residual)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("T,ks,kind,dtype", [(37, 3, "alibi", torch.float16), (45, 5, "kerple", torch.float32)])
def test_skewed_with_and_without_the_residual(T, ks, kind, dtype, residual):
    """Both compiled variants (RES on: the residual forms; off: F itself, the step-1 kernels), the
    output and every gradient against the reference."""
    run_dape(1, 3, T, 16, ks, 8, kind, dtype, op=forced(residual))


def test_the_switch_keeps_the_residual_only_for_a_large_bias():
    """residual_error against RESIDUAL_TOL with the model's own initialisation (DapeV2 and the bias
    module, H 12, D 32, k 3) in bf16: the residual for ALiBi at T 1536 and Kerple-power at 2048,
    not for dapev2-kerple (the default DAPE V2 model) at T 512; never in fp32."""
    from lenx.attention import ALiBi, DapeV2, KerpleLog, KerplePower

    torch.manual_seed(0)
    w1, b1, w2, b2 = (p.detach() for p in DapeV2(12, 32, 3).parameters())

    def error(bias, T, dtype=torch.bfloat16):
        t1 = skewed.host_tables(w1, b1, w2, b2, bias(12).table(T).detach(), T)[0]
        return skewed.residual_error(t1, w2, dtype)

    assert error(ALiBi, 1536) > skewed.RESIDUAL_TOL
    assert error(KerplePower, 2048) > skewed.RESIDUAL_TOL
    assert error(KerpleLog, 512) < skewed.RESIDUAL_TOL
    assert error(KerplePower, 2048, torch.float32) == 0.0


def test_the_residual_switch_decides_from_the_previous_call():
    """ResidualSwitch (the backend's, one per layer): None on the first call at a length and dtype (the
    op then decides with a sync), after that the previous call's estimate against RESIDUAL_TOL /
    MARGIN; False in fp32; a copy starts afresh."""
    import copy

    from test_dape_v2_large_bias import steep_table

    H = 2
    w1, b1, w2, b2 = (x.to(DEVICE).float() for x in conv_weights(H, 8, 3, True))

    def t1(table, T):
        return skewed.host_tables(w1, b1, w2, b2, table.to(DEVICE).detach(), T)[0]

    steep, mild = t1(steep_table(H, 16, [8.0, 3.0]), 16), t1(bias_table("kerple", H, 16), 16)
    switch = skewed.ResidualSwitch()
    assert switch.decide(steep, w2, torch.float16) is None
    assert switch.decide(mild, w2, torch.float16) is True  # the previous call's (steep) estimate
    assert switch.decide(mild, w2, torch.float16) is False
    assert switch.decide(t1(bias_table("kerple", H, 20), 20), w2, torch.float16) is None  # another length
    assert switch.decide(steep, w2, torch.float32) is False
    assert copy.deepcopy(switch).decide(mild, w2, torch.float16) is None


def test_the_forward_decides_from_its_tables(monkeypatch):
    """residual=None (what the backend passes): the residual where a steep table would cost fp16 Z
    and F more than RESIDUAL_TOL, not for a Kerple-log table, never in fp32."""
    from test_dape_v2_large_bias import steep_table

    seen = []
    real = skewed._conv_buffer
    monkeypatch.setattr(skewed, "_conv_buffer", lambda sb, wts, cfg, res: seen.append(res) or real(sb, wts, cfg, res))
    H, T = 2, 16
    w = [x.to(DEVICE).float() for x in conv_weights(H, 8, 3, True)]
    for table, dtype in [(steep_table(H, T, [8.0, 3.0]), torch.float16), (bias_table("kerple", H, T), torch.float16),
                         (steep_table(H, T, [8.0, 3.0]), torch.float32)]:
        q = torch.randn(1, H, T, 16, device=DEVICE, dtype=dtype)
        with torch.no_grad():
            skewed.dape_v2_skewed(q, q, q, *w, table.to(DEVICE).detach())
    assert seen == [True, False, False]


@pytest.mark.skipif(CUDA, reason="checks the interpreter's memory accesses")
@pytest.mark.parametrize("T,ks,kind", [(1, 3, "kerple"), (2, 5, "alibi"), (45, 7, None), (70, 3, "kerple")])
def test_every_access_stays_inside_its_tensors(T, ks, kind):
    """Loads and stores of every kernel, forward and backward, at sizes around the tile and band
    edges (T <= h included: a store there once fell outside the table)."""
    H = 2
    q, k, v = (torch.randn(1, H, T, 16, requires_grad=True) for _ in range(3))
    w = [x.float().requires_grad_() for x in conv_weights(H, 8, ks, kind is not None)]
    table = bias_table(kind, H, T)
    with bounds_checked():
        skewed.dape_v2_skewed(q, k, v, *w, table).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.skipif(CUDA, reason="checks the interpreter's memory accesses")
def test_bounds_check_catches_an_access_past_a_tensor():
    import triton
    import triton.language as tl

    @triton.jit
    def shifted_copy(X, Y, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(Y + i, tl.load(X + i + 1))

    x = torch.randn(16)
    with pytest.raises(Exception, match="outside every argument tensor"), bounds_checked():
        shifted_copy[(1,)](x, torch.empty(16), N=16)


@pytest.mark.skipif(CUDA, reason="moves the interpreter's buffer layout")
@pytest.mark.parametrize("T,ks,kind,keep,tiles", [(1, 7, "kerple", True, None), (2, 5, "alibi", False, None),
                                                  (45, 7, None, True, None), (70, 3, "kerple", False, None),
                                                  (45, 5, "alibi", True, "tiny")])
def test_kernels_read_only_what_they_stored(T, ks, kind, keep, tiles, monkeypatch):
    """Packed rows abut, so a load of a key past a row's last one would read the next row's first keys.
    With GAP unused (NaN) entries after every row of every buffer, such a load meets an entry no kernel
    stored: every lane any kernel loads from a buffer must have been stored before (reads_written),
    forward and backward, kept and recomputed, at odd sizes and many bands and row blocks, and the
    results still match the reference. The S buffer with the gaps shows that the kernels use them."""
    import triton.language as tl

    from kernel_cases import reads_written

    gap, H = 2, 3
    monkeypatch.setattr(skewed, "GAP", tl.constexpr(gap))
    real = skewed.new
    with reads_written() as track:
        monkeypatch.setattr(skewed, "new", lambda *args, **kwargs: track(real(*args, **kwargs)))
        q, k = (torch.randn(1, H, T, 16, device=DEVICE) for _ in range(2))
        sb = skewed._scores_buffer(q, k, skewed.CONFIG_FP32)
        config = TINY if tiles else None
        run_dape(1, H, T, 16, ks, 8, kind, torch.float32,
                 op=lambda *args: skewed.dape_v2_skewed(*args, keep=keep, config=config))
    starts = row_starts(T, gap)  # row i: keys 0 .. i, padding, then `gap` unused entries
    assert sb.shape == (1, starts[-1], 16)
    S = q @ k.transpose(-1, -2) / 4
    for i in range(T):
        assert_close(sb[0, starts[i]:starts[i] + i + 1, :H].T, S[0, :, i, :i + 1], 1e-6, f"S buffer row {i}")
        assert sb[0, starts[i] + i + 1:starts[i + 1]].isnan().all()


@pytest.mark.skipif(CUDA, reason="checks the interpreter's memory accesses")
def test_reads_written_catches_a_load_of_an_unstored_element():
    import triton
    import triton.language as tl

    from kernel_cases import reads_written

    @triton.jit
    def copy_from(X, Y, start, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(Y + i, tl.load(X + start + i))

    x, y = torch.randn(32), torch.empty(32)
    with reads_written() as track:
        track(y)
        copy_from[(1,)](x, y, 0, N=16)  # stores y[:16]
        copy_from[(1,)](y, x, 0, N=16)
        with pytest.raises(Exception, match="1 lanes that no kernel stored"):
            copy_from[(1,)](y, x, 1, N=16)


def test_backward_is_bitwise_repeatable():
    B, H, T, d = 1, 3, 40, 16
    q, k, v = (torch.randn(B, H, T, d, device=DEVICE, requires_grad=True) for _ in range(3))
    w = [x.to(DEVICE).float().requires_grad_() for x in conv_weights(H, 8, 3, True)]
    table = bias_table("kerple", H, T)
    leaves = [q, k, v, table, *w]
    g = torch.randn(B, H, T, d, device=DEVICE)
    runs = [torch.autograd.grad(skewed.dape_v2_skewed(q, k, v, *w, table), leaves, g) for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_causal():
    T, t = (40, 17) if not CUDA else (300, 150)
    tab = bias_table("kerple", 2, T)
    w = [x.to(DEVICE).float() for x in conv_weights(2, 4, 3, True)]
    assert causal_gap(lambda q, k, v: (skewed.dape_v2_skewed(q, k, v, *w, tab),), T, t) < 1e-6


def test_unequal_flash_tiles():
    """The flash kernels' unmasked tiles read t2 from the tile table: rows a multiple of the keys in
    the forward (tiles step by the keys), keys a multiple of the rows in the backward."""
    tiles = {"attn_fwd": (32, 16, 4, 1), "attn_bwd": (16, 32, 4, 1)}

    def unequal(q, k, v, w1, b1, w2, b2, table):
        return skewed.dape_v2_skewed(q, k, v, w1, b1, w2, b2, table, config=tiles)

    run_dape(1, 3, 100, 16, 3, 8, "kerple", torch.float32, op=unequal)


@pytest.mark.parametrize("T,BM,BN", [(1, 16, 16), (45, 32, 16), (100, 16, 32), (130, 64, 64)])
def test_t2_tile_table_holds_t2_by_distance(T, BM, BN):
    """Tile q, row a, key x holds t2 at distance q min(BM, BN) + a - x, zero outside 0 .. T - 1."""
    H = 3
    t2f = torch.randn(H, 2 * T - 1, device=DEVICE)
    table, nq = skewed._t2_tiles(t2f, T, BM, BN)
    assert table.shape == (H, nq, BM, BN) and nq == -(-T // min(BM, BN)) + 1
    q, a, x = torch.meshgrid(torch.arange(nq), torch.arange(BM), torch.arange(BN), indexing="ij")
    dist = (q * min(BM, BN) + a - x).to(DEVICE)
    inside = (dist >= 0) & (dist < T)
    want = torch.where(inside, t2f[:, (T - 1 + dist).clamp(0, 2 * T - 2)], torch.zeros((), device=DEVICE))
    assert torch.equal(table, want)


@pytest.mark.parametrize("keep", [True, False])
def test_buffer_bytes_match_the_buffers(keep, monkeypatch):
    """buffer_bytes is what the T x T buffers take, forward and backward: the slot-minor S and G
    (pow2(H) slots) and the hidden Z and dY (DP channels) exactly, the head-planar S, F, G and dS
    H / pow2(H) of it; with keep=True the forward keeps one slot-minor and one planar buffer."""
    B, H, T, ks, D = 2, 3, 21, 5, 8
    sizes = []
    real = skewed.new
    monkeypatch.setattr(skewed, "new", lambda shape, like, dtype=None: sizes.append(
        (tuple(shape), real(shape, like, dtype).nbytes)) or real(shape, like, dtype))
    q, k, v = (torch.randn(B, H, T, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    w = [x.to(DEVICE).float() for x in conv_weights(H, D, ks, False)]
    out = skewed.dape_v2_skewed(q, k, v, *w, keep=keep)
    score, hidden = skewed.buffer_bytes(B, H, T, torch.float32), skewed.buffer_bytes(B, H, T, torch.float32, 16)
    P, PZ = row_starts(T)[-1].item(), T * (T + 7) // 2  # hidden rows: keys 0 .. i + 3 (k <= 7)
    assert score == B * 16 * P * 4 and hidden == B * 16 * PZ * 4
    planar = [(B, H, P, score * H // 16)]
    forward = planar + [(B, P, 16, score), (B, PZ, 16, hidden)] + planar  # S, its slots, Z, F
    assert [(*s, n) for s, n in sizes if P in s or PZ in s] == forward
    kept = [x.nbytes for x in out.grad_fn.saved_tensors if x is not None and x.shape[1:] in ((H, P), (P, 16))]
    assert kept == ([score, score * H // 16] if keep else [])
    sizes.clear()
    out.sum().backward()
    backward = (forward if not keep else []) + planar + [(B, P, 16, score), (B, PZ, 16, hidden)] + planar
    assert [(*s, n) for s, n in sizes if P in s or PZ in s] == backward  # G, its slots, dY, dS
    # the 125m shapes in bf16: 136 MB per score-shaped buffer at 512 x 32 (268 MB as a square)
    assert skewed.buffer_bytes(32, 12, 512, torch.bfloat16) == 32 * 16 * row_starts(512)[-1].item() * 2
    assert skewed.buffer_bytes(8, 12, 2048, torch.bfloat16, 32) == 8 * 32 * (2048 * 2055 // 2) * 2


def test_rejects_bad_arguments():
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    w = [x.to(DEVICE).float() for x in conv_weights(2, 4, 3, True)]
    with pytest.raises(ValueError, match="do not fit"):
        skewed.dape_v2_skewed(q, q, q, *w)  # 2H input channels but no table
    with pytest.raises(ValueError, match="bias table must be"):
        skewed.dape_v2_skewed(q, q, q, *w, torch.zeros(2, 9, device=DEVICE))
    with pytest.raises(ValueError, match="unknown skewed-kernel settings"):
        skewed.dape_v2_skewed(q, q, q, *w, torch.zeros(2, 15, device=DEVICE), config={"conv_fwd": (4, 32, 4, 1)})


@pytest.mark.gpu
@pytest.mark.parametrize("T", GPU_T)
def test_gpu_skewed_kerple(T):
    """The paper's headline setting in bf16: H = 12, d = 64, k = 3, D = 32, Kerple."""
    run_dape(batch_for(T), 12, T, 64, 3, 32, "kerple", torch.bfloat16, op=skewed.dape_v2_skewed)


@pytest.mark.gpu
@pytest.mark.parametrize("T,H,d,ks,D,kind", [
    (1000, 4, 32, 5, 16, None),
    (128, 2, 64, 7, 8, "alibi"),
    (1000, 3, 32, 1, 8, "t5"),
    (1000, 16, 64, 3, 64, "kerple"),
    (17, 16, 64, 5, 32, "kerple"),
    (1000, 12, 64, 7, 32, "kerple"),
    (2048, 12, 128, 3, 32, "kerple"),
    # d = 128 (the backend routes it here): T 1, odd T, ALiBi, k 5 at 16 heads
    (1, 12, 128, 3, 32, "kerple"),
    (111, 12, 128, 3, 32, "kerple"),
    (1000, 12, 128, 3, 32, "alibi"),
    (300, 16, 128, 5, 32, "kerple"),
    (1000, 4, 128, 1, 16, None),
])
def test_gpu_skewed_shapes(T, H, d, ks, D, kind):
    run_dape(2, H, T, d, ks, D, kind, torch.bfloat16, op=skewed.dape_v2_skewed)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_skewed_recompute(d):
    run_dape(2, 12, 1000, d, 3, 32, "kerple", torch.bfloat16, op=recompute)


@pytest.mark.gpu
@pytest.mark.parametrize("residual", [False, True])
def test_gpu_skewed_both_variants(residual):
    """The compiled variants with and without F's residual, forced: the headline shape, and k 7 with
    ALiBi (shapes the GPU suite passed with either variant before the switch)."""
    run_dape(2, 12, 1000, 64, 3, 32, "kerple", torch.bfloat16, op=forced(residual))
    run_dape(2, 2, 128, 64, 7, 8, "alibi", torch.bfloat16, op=forced(residual))


@pytest.mark.gpu
def test_gpu_skewed_head_dim_128_fp32():
    run_dape(1, 3, 300, 128, 3, 8, "kerple", torch.float32, op=skewed.dape_v2_skewed)


def test_conv_stages_drop_to_what_fits_in_shared_memory(monkeypatch):
    """A conv launch whose staged tiles overflow shared memory runs with fewer stages, and the count
    that fits is remembered for the same kernel and settings."""
    from triton.runtime.errors import OutOfResources

    calls = []

    class Kernel:
        fn = type("Fn", (), {"__name__": "_fake_conv"})

        def __getitem__(self, grid):
            def launch(*args, num_stages, **settings):
                calls.append(num_stages)
                if num_stages > 1:
                    raise OutOfResources(233472, 232448, "shared memory")
            return launch

    monkeypatch.setattr(skewed, "_STAGES", {})
    skewed._staged(Kernel(), (1,), num_stages=3, KS=7)
    skewed._staged(Kernel(), (1,), num_stages=3, KS=7)
    assert calls == [3, 2, 1, 1]
    skewed._staged(Kernel(), (1,), num_stages=3, KS=3)  # other settings: tried from the top again
    assert calls[4:] == [3, 2, 1]
