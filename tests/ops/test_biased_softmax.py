"""lenx.ops.biased_softmax: the reference against a direct computation, and the fused kernels
(triton.py) against the reference, the output and every gradient. Without CUDA the kernels run
under Triton's interpreter at small sizes; the gpu tests add long sequences in bf16."""

import math

import pytest
import torch

from kernel_cases import (CUDA, DEVICE, GPU_T, batch_for, bias_table, causal_gap, compare, fp32_copy, leaf,
                          one_key_floors, tolerance)
from lenx.ops.biased_softmax.reference import biased_softmax_reference, table_bias


def test_reference_matches_rowwise_softmax():
    """Each row on its own in float64: softmax over keys 0..i of q_i.k_j / sqrt(d) + table[h, i - j]."""
    B, H, T, d = 2, 3, 11, 8
    q, k, v = (torch.randn(B, H, T, d, dtype=torch.float64) for _ in range(3))
    table = torch.randn(H, 2 * T - 1, dtype=torch.float64)
    out = biased_softmax_reference(q, k, v, table)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                logits = torch.stack([q[b, h, i] @ k[b, h, j] / math.sqrt(d) + table[h, i - j + T - 1]
                                      for j in range(i + 1)])
                expected = (logits.softmax(0)[:, None] * v[b, h, : i + 1]).sum(0)
                assert torch.allclose(out[b, h, i], expected, atol=1e-12)
    assert torch.equal(table_bias(table, torch.tensor([4]), torch.tensor([1]))[:, 0, 0], table[:, 3 + T - 1])


pytest.importorskip("triton")
from lenx.ops.biased_softmax import triton as kernel  # noqa: E402


def run_biased(B, H, T, d, kind, dtype, tol=None, config=None):
    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    tab = bias_table(kind, H, T)
    do = torch.randn(B, H, T, d, device=DEVICE)
    leaves = [q, k, v] + ([tab] if tab is not None else [])
    out = kernel.biased_attention(q, k, v, tab, config=config)
    grads = torch.autograd.grad(out, leaves, do.to(dtype))
    refs = [fp32_copy(x) for x in (q, k, v)] + leaves[3:]
    ref = biased_softmax_reference(*refs[:3], tab)
    ref_grads = torch.autograd.grad(ref, refs, do)
    names = ["out", "dq", "dk", "dv", "dtable"][: 1 + len(leaves)]
    floors = one_key_floors(names, ref_grads[2]) if T == 1 else {}
    compare(f"biased B{B} H{H} T{T} d{d} {kind} {dtype}", [out, *grads], [ref, *ref_grads], names,
            tol or tolerance(dtype), floors)


def run_biased_kerple_params(B, H, T, d, dtype, kind="log"):
    """The Kerple mode: the bias's two parameters get their gradients from the kernel directly (no
    table gradient); one head's first parameter sits below its clamp, so its gradient must be
    exactly zero."""
    from lenx.attention import KerpleLog, KerplePower

    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    bias = (KerpleLog if kind == "log" else KerplePower)(H).to(DEVICE)
    params = [bias.r1, bias.r2] if kind == "log" else [bias.a, bias.p]
    with torch.no_grad():
        params[0][0] = 1e-3
    do = torch.randn(B, H, T, d, device=DEVICE)
    out = kernel.biased_attention(q, k, v, bias.table(T, DEVICE), **bias.fused_grad_args())
    grads = torch.autograd.grad(out, [q, k, v] + params, do.to(dtype))
    refs = [fp32_copy(x) for x in (q, k, v)]
    ref = biased_softmax_reference(*refs, bias.table(T, DEVICE))
    ref_grads = torch.autograd.grad(ref, refs + params, do)
    assert grads[3][0] == 0 and ref_grads[3][0] == 0
    names = ["out", "dq", "dk", "dv", "dx", "dy"]
    floors = one_key_floors(names, ref_grads[2]) if T == 1 else {}
    compare(f"biased kerple-{kind} params B{B} H{H} T{T} d{d} {dtype}", [out, *grads], [ref, *ref_grads], names,
            tolerance(dtype), floors)


def run_biased_t5_tail(B, H, T, d, dtype):
    """T5 with the constant-tail table gradient (key tiles beyond the last bucket's first distance
    add only their total): the embedding's gradient against the reference."""
    from lenx.attention import T5Bias

    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    bias = T5Bias(H).to(DEVICE)
    with torch.no_grad():
        bias.relative_attention_bias.weight.normal_()
    do = torch.randn(B, H, T, d, device=DEVICE)
    params = [bias.relative_attention_bias.weight]
    out = kernel.biased_attention(q, k, v, bias.table(T, DEVICE), **bias.fused_grad_args())
    grads = torch.autograd.grad(out, [q, k, v] + params, do.to(dtype))
    refs = [fp32_copy(x) for x in (q, k, v)]
    ref = biased_softmax_reference(*refs, bias.table(T, DEVICE))
    ref_grads = torch.autograd.grad(ref, refs + params, do)
    names = ["out", "dq", "dk", "dv", "dweight"]
    floors = one_key_floors(names, ref_grads[2]) if T == 1 else {}
    compare(f"biased t5 tail B{B} H{H} T{T} d{d} {dtype}", [out, *grads], [ref, *ref_grads], names,
            tolerance(dtype), floors)


# --- small sizes: the interpreter on CPU (and the compiled kernels on a GPU) ------------------

@pytest.mark.parametrize("T", [1, 17, 40])
@pytest.mark.parametrize("kind", ["kerple", None])
def test_biased_small(T, kind):
    run_biased(2, 2, T, 16, kind, torch.float32)


@pytest.mark.parametrize("T", [1, 17, 40])
@pytest.mark.parametrize("kind", ["log", "power"])
def test_biased_small_kerple_params(T, kind):
    run_biased_kerple_params(2, 3, T, 16, torch.float32, kind)


@pytest.mark.parametrize("T", [17, 200])
def test_biased_small_t5_tail(T):
    run_biased_t5_tail(1, 2, T, 16, torch.float32)


def test_biased_small_t5_alibi():
    run_biased(1, 3, 33, 32, "t5", torch.float32)
    run_biased(1, 2, 20, 16, "alibi", torch.float32)


@pytest.mark.parametrize("kind", ["kerple", "kerple-power", "alibi", "t5"])
def test_biased_small_fp16_band(kind):
    """The bias band as fp16 residuals against per-row fp32 offsets (the bf16/fp16 default) on
    the exact fp32 path, with larger tiles (several key tiles per query tile, padding rows): the
    residuals' rounding is the only error (measured <= 4e-4), so 2e-3."""
    config = {"band": ("fp16",), "fwd": (64, 32, 4, 1), "dq": (64, 32, 4, 1)}
    run_biased(1, 2, 130, 16, kind, torch.float32, tol=2e-3, config=config)


def test_biased_rejects_bad_arguments():
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    from lenx.attention import KerpleLog

    tab = KerpleLog(2).to(DEVICE).table(8, DEVICE)
    r = torch.ones(2, device=DEVICE)
    with pytest.raises(ValueError, match="kerple must be"):
        kernel.biased_attention(q, q, q, tab, ("cubic", r, r))
    with pytest.raises(ValueError, match="kerple must be"):
        kernel.biased_attention(q, q, q, None, ("log", r, r))
    with pytest.raises(ValueError, match="tail must be"):
        kernel.biased_attention(q, q, q, None, tail=113)
    with pytest.raises(ValueError, match="tail must be"):
        kernel.biased_attention(q, q, q, tab, ("log", r, r), tail=113)
    with pytest.raises(ValueError, match="bias table must be"):
        kernel.biased_attention(q, q, q, tab[:, :5])
    with pytest.raises(ValueError, match="head dims"):
        kernel.biased_attention(*(torch.randn(1, 2, 8, 12),) * 3)
    with pytest.raises(ValueError, match="unknown tile settings"):
        kernel.biased_attention(q, q, q, tab, config={"fwdd": (64, 64, 4, 3)})
    with pytest.raises(ValueError, match="key tiles must be"):
        kernel.biased_attention(q, q, q, tab, config={"fwd": (64, 128, 4, 3)})


def test_causal():
    T, t = (40, 17) if not CUDA else (300, 150)
    tab = bias_table("kerple", 2, T)
    assert causal_gap(lambda q, k, v: (kernel.biased_attention(q, k, v, tab),), T, t) < 1e-6


# --- long sequences in bf16 (and fp32 at small T): the compiled kernels on a GPU ---------------

@pytest.mark.gpu
@pytest.mark.parametrize("T", GPU_T)
def test_gpu_biased_kerple(T):
    run_biased(batch_for(T), 12, T, 64, "kerple", torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("T", GPU_T)
def test_gpu_biased_kerple_params(T):
    run_biased_kerple_params(batch_for(T), 12, T, 64, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [128, 1000, 4096])
def test_gpu_biased_t5_tail(T):
    run_biased_t5_tail(batch_for(T), 12, T, 64, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [128, 4096])
def test_gpu_biased_kerple_power_params(T):
    run_biased_kerple_params(batch_for(T), 12, T, 64, torch.bfloat16, "power")


@pytest.mark.gpu
@pytest.mark.parametrize("T,H,d,kind", [(1000, 4, 128, "alibi"), (1000, 3, 32, "t5"), (128, 2, 16, None)])
def test_gpu_biased_other(T, H, d, kind):
    run_biased(2, H, T, d, kind, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_biased_fp32():
    run_biased(2, 2, 300, 32, "kerple", torch.float32)


# --- windows and document ids (masks) --------------------------------------------------------

# small tiles: several key tiles per query block and several query blocks per key block, so that
# whole tiles are skipped, edge tiles masked and clear tiles left unmasked at T 63 and 111
SMALL_TILES = {"fwd": (32, 16, 4, 1), "dkdv": (16, 32, 4, 1), "dq": (32, 16, 4, 1)}


def document_ids(B, T, docs, seed=0):
    """[B, T] ids of `docs` documents of random lengths, one of them of length 1 where T allows; the
    second sequence's cuts mirrored, its ids not starting at 0 (any integers will do)."""
    if not docs:
        return None
    g = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randperm(T - 1, generator=g)[:docs - 1].add(1).tolist()) if T > 1 else []
    if T > 2 and docs > 2:  # a document of one token: two neighbouring cuts
        cuts = sorted(set(cuts[:-1] + [cuts[0] + 1 if cuts[0] + 1 < T else cuts[0] - 1]))
    ids = torch.zeros(T, dtype=torch.long)
    for c in cuts:
        ids[c:] += 1
    return torch.stack([ids, 7 + ids[-1] - ids.flip(0)][:B]).to(DEVICE)


def masked_operands(B, H, T, d, dtype):
    """q . k / sqrt(d) near +3 for every pair (q, k near +1 along one direction), so every key a row
    could see carries a real share: a key let through past a window's edge or from another
    document moves the output and every gradient well past the tolerance."""
    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    with torch.no_grad():
        q.mul_(0.3).add_(3 / d ** 0.5)
        k.mul_(0.3).add_(1.0)
    return q, k, v


def run_biased_masked(B, H, T, d, window, docs, kind="kerple", dtype=torch.float32, mode="table", config=SMALL_TILES,
                      tol=None):
    """The kernels with a window and/or document ids against the float64 reference with the same mask:
    out, dq, dk, dv and the bias's gradient (mode "table": the table's; "kerple": the Kerple
    parameters' through the kernel's direct path; "t5": T5's embedding through the constant-tail
    path; "fox": c's)."""
    from lenx.attention import KerpleLog, T5Bias
    from lenx.ops.forgetting.reference import forgetting_reference
    from lenx.ops.forgetting.triton import forgetting_attention

    q, k, v = masked_operands(B, H, T, d, dtype)
    segments = document_ids(B, T, docs)
    do = torch.randn(B, H, T, d, device=DEVICE)
    to64 = (lambda x: x.detach().double().requires_grad_()) if not CUDA else fp32_copy
    refs = [to64(x) for x in (q, k, v)]
    masks = dict(window=window, segments=segments)
    if mode == "fox":  # c: prefix sums of log forget gates, gentle so that far keys still weigh
        c = (-0.05 * torch.rand(B, H, T, device=DEVICE)).cumsum(-1).requires_grad_()
        out = forgetting_attention(q, k, v, c, config=config, **masks)
        params, ref_params = [c], [to64(c)]
        ref = forgetting_reference(*refs, ref_params[0], **masks)
    else:
        if mode == "table":
            tab = bias_table(kind, H, T)
            if tab is not None:
                tab = (0.1 * tab).detach().requires_grad_()  # gentle: far keys keep a share
            params, extra = ([tab] if tab is not None else []), {}
        else:
            bias = (KerpleLog if mode == "kerple" else T5Bias)(H).to(DEVICE)
            if mode == "t5":
                with torch.no_grad():
                    bias.relative_attention_bias.weight.normal_(0, 0.3)
            params = [bias.r1, bias.r2] if mode == "kerple" else [bias.relative_attention_bias.weight]
            tab, extra = bias.table(T, DEVICE), bias.fused_grad_args()
        out = kernel.biased_attention(q, k, v, tab, config=config, **extra, **masks)
        ref_params = [to64(p) for p in params] if mode == "table" else params
        ref_tab = ref_params[0] if mode == "table" and params else (None if mode == "table" else bias.table(T, DEVICE))
        ref = biased_softmax_reference(*refs, ref_tab, **masks)
    grads = torch.autograd.grad(out, [q, k, v] + params, do.to(dtype))
    ref_grads = torch.autograd.grad(ref, refs + ref_params, do.to(ref.dtype))
    names = ["out", "dq", "dk", "dv"] + [f"d{mode}{i}" for i in range(len(params))]
    floors = one_key_floors(names, ref_grads[2]) if T == 1 or window == 1 else {}
    compare(f"biased masked {mode} {kind} B{B} H{H} T{T} W{window} docs{docs} {dtype}", [out, *grads],
            [ref, *ref_grads], names, tol or masked_tolerance(names, dtype), floors)


def masked_tolerance(names, dtype):
    """tolerance(dtype), but in 16 bits dq and the gradients the dq kernel sums (Kerple's parameters)
    get 4x: masked_operands' keys share a component of 1 against a spread of 0.3, so dq = dS K, whose
    useful part is dS (K - 1) (a row of dS sums to 0), carries the 16-bit rounding of each dS entry
    times 1 instead of 0.3 (measured on the H200: dq 1.0e-2 here, 3e-3 on unshifted operands)."""
    base = tolerance(dtype)
    if dtype == torch.float32:
        return base
    return {name: 4 * base if name == "dq" or name.startswith("dkerple") else base for name in names}


# windows of 1, T - 1, > T, mid-tile (tiles of 16 keys and 32 rows) and a whole number of tiles
@pytest.mark.parametrize("T,window", [(1, 1), (63, 1), (63, 62), (63, 5), (111, 40), (111, 32), (111, 200)])
@pytest.mark.parametrize("kind", ["kerple", None])
def test_biased_window(T, window, kind):
    run_biased_masked(2, 2, T, 16, window, 0, kind)


@pytest.mark.parametrize("T,docs", [(1, 1), (63, 5), (111, 9), (111, 1)])
def test_biased_documents(T, docs):
    run_biased_masked(2, 2, T, 16, 0, docs, "alibi")


@pytest.mark.parametrize("mode,T,window,docs", [("table", 111, 37, 4), ("kerple", 111, 21, 0), ("kerple", 111, 0, 6),
                                                ("t5", 200, 150, 0), ("t5", 200, 0, 2), ("t5", 200, 130, 3),
                                                ("fox", 111, 0, 5), ("fox", 111, 19, 3)])
def test_biased_masked_gradient_paths(mode, T, window, docs):
    """Each bias gradient's own path under masks: the table's (per-diagonal sums), Kerple's two
    parameters (the dq kernel's direct sums), T5's constant tail (from distance 113 on: the tail
    tiles, masked, exist at T 200) and FoX's dc (the key-owner kernel's column sums)."""
    run_biased_masked(2, 2, T, 16, window, docs, "t5" if mode == "table" else "kerple", mode=mode)


def test_biased_masked_default_tiles():
    """The fp32 default tiles (one query block of 64 rows and key tiles of 32; 32-row key-owner tiles)."""
    run_biased_masked(1, 2, 130, 16, 45, 3, "kerple", config=None)
    run_biased_masked(1, 2, 130, 16, 70, 0, "kerple-power", config=None)


def test_biased_masked_rejects_bad_arguments():
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    for window in (-1, 2.5, True):
        with pytest.raises(ValueError, match="window must be an int"):
            kernel.biased_attention(q, q, q, window=window)
    with pytest.raises(ValueError, match="segments must be integer document ids"):
        kernel.biased_attention(q, q, q, segments=torch.zeros(1, 7, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="segments must be integer document ids"):
        kernel.biased_attention(q, q, q, segments=torch.zeros(1, 8, device=DEVICE))


def test_document_spans_take_any_ids():
    """The kernels compare each token's document's first position: ids in any order (a document in
    two runs, ids that fall) give the spans of the ids as they are."""
    from lenx.ops._launch import check_masks

    ids = torch.tensor([[5, 5, 2, 2, 2, 5, 9], [0, 1, 1, 1, 2, 2, 3]])
    window, spans = check_masks(9, ids, 2, 7, torch.device("cpu"))
    assert window == 0  # a window of T or more masks nothing
    assert spans[0].tolist() == [[0, 0, 2, 2, 2, 0, 6], [0, 1, 1, 1, 4, 4, 6]]
    assert spans[1].tolist() == [[5, 5, 4, 4, 4, 5, 6], [0, 3, 3, 3, 5, 5, 6]]
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 16, device=DEVICE) for _ in range(3))
    scattered = torch.tensor([[3] * 10 + [1] * 10 + [3] * 10 + [0] * 10], device=DEVICE)
    out = kernel.biased_attention(q, k, v, segments=scattered, config=SMALL_TILES)
    ref = biased_softmax_reference(q, k, v, segments=scattered)
    assert (out - ref).abs().max() < 1e-5


import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from lenx.ops import tiles  # noqa: E402


# Kernel pieces with one edge wrong (tiles.py), for the mutation test below.
@triton.jit
def _late_start(m0, rows, T, WIN, DOC, BM: tl.constexpr, BN: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    lo, edge = tiles.key_tiles(m0, rows, T, WIN, DOC, BM, BN, HAS_W, HAS_SEG)  # skips the first tile a row needs
    return tl.minimum(lo + BN, m0), tl.minimum(tl.maximum(edge, lo + BN), m0)


@triton.jit
def _wide_window(allowed, row, col, row_doc, DOC, T, WIN, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    return tiles.window_document(allowed, row, col, row_doc, DOC, T, WIN + 1, HAS_W, HAS_SEG)  # one key too many


@triton.jit
def _short_end(n0, cols, T, WIN, LAST, BN: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    return tiles.query_end(n0, cols, T, WIN, LAST, BN, HAS_W, HAS_SEG) - 16  # one key-owner tile of rows short


WRONG_EDGES = {"key_tiles": _late_start, "window_document": _wide_window, "query_end": _short_end}


@pytest.mark.skipif(CUDA, reason="patches the kernels' module globals, which Triton's interpreter reads at each call "
                    "(compiled kernels are cached)")
@pytest.mark.parametrize("piece,window,docs", [("key_tiles", 40, 0), ("key_tiles", 0, 5), ("window_document", 40, 0),
                                                ("query_end", 40, 0), ("query_end", 0, 5)])
def test_a_wrong_edge_fails(monkeypatch, piece, window, docs):
    """The masked tests see one edge wrong: each kernel piece replaced by one that skips a tile a row
    needs, lets one key too many through, or stops the key-owner kernel a tile early."""
    from lenx.ops.biased_softmax import backward

    wrong = WRONG_EDGES[piece]
    for module in (kernel, backward):
        if hasattr(module, piece):
            monkeypatch.setattr(module, piece, wrong)
    with pytest.raises(AssertionError, match="over tolerance"):
        run_biased_masked(1, 2, 111, 16, window, docs, "kerple")


@pytest.mark.parametrize("window,docs,later", [(0, True, 32), (20, False, 64)])
def test_tiles_out_of_reach_are_skipped(window, docs, later):
    """Documents on tile boundaries (32 rows, 16 keys), or a window of 20: the kernels never read a
    tile wholly in an earlier document or before a block's window (cost O(the documents) or O(W),
    not O(T)): NaNs in q, k, v at positions 0..31 reach none of the outputs and gradients from
    `later` on (rows 64.. see keys 45.. through the window), which match the reference's."""
    torch.manual_seed(0)
    T = 96
    segments = (torch.arange(T, device=DEVICE) // 32)[None].expand(2, T) if docs else None
    q, k, v = (torch.randn(2, 2, T, 16, device=DEVICE) for _ in range(3))
    tab = bias_table("kerple", 2, T)
    ref = [x.clone().requires_grad_() for x in (q, k, v)]
    for x in (q, k, v):
        x[..., :32, :] = float("nan")
        x.requires_grad_()
    do = torch.randn(2, 2, T, 16, device=DEVICE)
    out = kernel.biased_attention(q, k, v, tab, segments=segments, window=window, config=SMALL_TILES)
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref_out = biased_softmax_reference(*ref, tab.detach(), segments=segments, window=window)
    ref_grads = torch.autograd.grad(ref_out, ref, do)
    later = slice(later, None)
    compare(f"biased out of reach W{window} docs{docs}", [out[..., later, :], *(g[..., later, :] for g in grads)],
            [ref_out[..., later, :], *(g[..., later, :] for g in ref_grads)], ["out", "dq", "dk", "dv"], 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("T,window,docs", [(1000, 1, 0), (1000, 129, 0), (4096, 512, 0), (4096, 0, 8),
                                           (4096, 700, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_biased_masked(T, window, docs, dtype):
    run_biased_masked(batch_for(T), 4, T, 64, window, docs, "kerple", dtype=dtype, config=None)


@pytest.mark.gpu
def test_gpu_biased_masked_wide_heads():
    """Head dim 128: the wide tiles (band.CONFIG_WIDE: 128-row forward blocks, 32-row key-owner tiles)."""
    run_biased_masked(2, 4, 1000, 128, 129, 8, "alibi", dtype=torch.bfloat16, config=None)


@pytest.mark.gpu
@pytest.mark.parametrize("mode,kind", [("table", "alibi"), ("table", None), ("kerple", "kerple"), ("t5", "t5"),
                                       ("fox", None)])
def test_gpu_biased_masked_paths(mode, kind):
    run_biased_masked(2, 4, 1000, 64, 129 if mode != "fox" else 0, 8, kind, dtype=torch.bfloat16, mode=mode,
                      config=None)
