"""The biased-softmax and FoX kernels with a factor per query row (q_scale: a query temperature
folded into their score scale) against the float64 reference of the scaled q, forward and every
gradient: q's is the gradient in the unscaled q, the factor included, and the factor's own (SSMax's
s_h gets its gradient through it). Without CUDA under Triton's
interpreter at small sizes (odd T, several tiles, windows, documents); the gpu tests at the 125m
shape (H 12, d 64, bf16, T 1000)."""

import pytest
import torch

from helpers import rel_err
from kernel_cases import CUDA, DEVICE, bias_table, causal_gap, compare, leaf, one_key_floors, tolerance
from lenx.ops.biased_softmax.reference import biased_softmax_reference

pytest.importorskip("triton")
from lenx.attention import KerpleLog  # noqa: E402
from lenx.attention.temperature import QueryTemperature  # noqa: E402
from lenx.ops.biased_softmax.triton import biased_attention  # noqa: E402
from lenx.ops.forgetting.reference import forgetting_reference  # noqa: E402
from lenx.ops.forgetting.triton import forgetting_attention  # noqa: E402

# several key tiles per query block and several query blocks per key block at T 63 and 111
SMALL_TILES = {"fwd": (32, 16, 4, 1), "dkdv": (16, 32, 4, 1), "dq": (32, 16, 4, 1)}


def documents(B, T, n, seed=0):
    """[B, T] ids of n documents cut at random places (the second sequence's ids start at 5)."""
    if not n:
        return None
    g = torch.Generator().manual_seed(seed)
    ids = []
    for b in range(B):
        cuts = torch.randperm(max(T - 1, 1), generator=g)[:n - 1] + 1 if T > 1 else torch.zeros(0, dtype=torch.long)
        ids.append((torch.arange(T)[:, None] >= cuts[None, :]).sum(1) + 5 * b)
    return torch.stack(ids).to(DEVICE)


def row_factors(shape, B, H, T):
    """A factor per row in one of the broadcast shapes a temperature gives ([T] for logn/l4temp,
    [H, T] for SSMax, [B, 1, T] / [B, H, T] per sequence), between 0.3 and 2.5, and 0 at row 0 of
    the first sequence (SSMax's s_h log 1); "BTH": a [B, H, T] view with non-unit time strides."""
    g = torch.Generator().manual_seed(3)
    full = 0.3 + 2.2 * torch.rand(B, H, T, generator=g, dtype=torch.float64)
    full[0, :, 0] = 0.0
    f = {"T": full[0, 0], "HT": full[0], "B1T": full[:, :1], "BHT": full,
         "BTH": full.transpose(1, 2).contiguous()}[shape]
    f = f.float().to(DEVICE)
    return (f.transpose(1, 2) if shape == "BTH" else f).detach().requires_grad_()


def run_scaled(B, H, T, d, shape="HT", window=0, docs=0, mode="table", dtype=torch.float32, config=SMALL_TILES,
               tol=None):
    """out, dq, dk, dv, the factor's gradient df and the bias's (mode "table": a Kerple table's;
    "kerple": its two parameters' through the kernel's direct sums; "fox": c's; "none": no bias)
    against the float64 reference of q * f."""
    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    f = row_factors(shape, B, H, T)
    segments = documents(B, T, docs)
    masks = dict(window=window, segments=segments)
    to64 = (lambda x: x.detach().double().requires_grad_())
    refs = [to64(x) for x in (q, k, v, f)]
    q_ref = refs[0] * refs[3][..., None]
    if mode == "fox":
        c = (-0.05 * torch.rand(B, H, T, device=DEVICE)).cumsum(-1).requires_grad_()
        out = forgetting_attention(q, k, v, c, config=config, q_scale=f, **masks)
        params, ref_params = [c], [to64(c)]
        ref = forgetting_reference(q_ref, *refs[1:3], ref_params[0], **masks)
    elif mode == "kerple":
        bias = KerpleLog(H).to(DEVICE)
        params = ref_params = [bias.r1, bias.r2]
        out = biased_attention(q, k, v, bias.table(T, DEVICE), **bias.fused_grad_args(), config=config, q_scale=f,
                               **masks)
        ref = biased_softmax_reference(q_ref, *refs[1:3], bias.table(T, DEVICE).double(), **masks)
    else:
        tab = None if mode == "none" else (0.1 * bias_table("kerple", H, T)).detach().requires_grad_()
        params = [] if tab is None else [tab]
        ref_params = [to64(p) for p in params]
        out = biased_attention(q, k, v, tab, config=config, q_scale=f, **masks)
        ref = biased_softmax_reference(q_ref, *refs[1:3], *ref_params, **masks)
    do = torch.randn(B, H, T, d, device=DEVICE)
    grads = torch.autograd.grad(out, [q, k, v, f] + params, do.to(dtype))
    ref_grads = torch.autograd.grad(ref, refs + ref_params, do.double())
    names = ["out", "dq", "dk", "dv", "df"] + [f"d{mode}{i}" for i in range(len(params))]
    floors = one_key_floors(names, ref_grads[2]) if T == 1 or window == 1 else {}
    compare(f"scaled rows {mode} {shape} B{B} H{H} T{T} W{window} docs{docs} {dtype}", [out, *grads],
            [ref, *ref_grads], names, tol or tolerance(dtype), floors)


@pytest.mark.parametrize("T", [1, 63, 111])
@pytest.mark.parametrize("shape", ["T", "HT", "BHT"])
def test_scaled_rows_against_the_reference(T, shape):
    run_scaled(2, 2, T, 16, shape)


@pytest.mark.parametrize("shape,mode,window,docs", [("B1T", "table", 37, 0), ("BTH", "table", 0, 5),
                                                    ("HT", "kerple", 21, 0), ("HT", "kerple", 0, 6),
                                                    ("HT", "none", 40, 3), ("B1T", "fox", 0, 5), ("HT", "fox", 19, 0)])
def test_scaled_rows_with_windows_documents_and_every_gradient_path(shape, mode, window, docs):
    """Each bias gradient's path (the table's diagonal sums, Kerple's direct sums, FoX's column sums)
    with the factor, under a window and/or documents, at T 111 (edge tiles masked, far ones skipped)."""
    run_scaled(2, 2, 111, 16, shape, window, docs, mode)


def test_scaled_rows_at_the_default_tiles():
    run_scaled(1, 2, 130, 16, "HT", 45, 3, "kerple", config=None)


def test_scaled_rows_stay_causal():
    T, t = (40, 17) if not CUDA else (300, 150)
    tab = bias_table("kerple", 2, T)
    f = row_factors("HT", 1, 2, T)
    assert causal_gap(lambda q, k, v: (biased_attention(q, k, v, tab, q_scale=f),), T, t) < 1e-6


def test_a_bad_factor_is_a_one_line_error():
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    for bad in (torch.ones(7, device=DEVICE), torch.ones(3, 8, device=DEVICE), torch.ones(2, 2, 8, device=DEVICE),
                torch.ones(1, 1, 1, 8, device=DEVICE), torch.tensor(2.0, device=DEVICE)):
        with pytest.raises(ValueError, match="q_scale must be a real factor per row"):
            biased_attention(q, q, q, q_scale=bad)
    with pytest.raises(ValueError, match="q_scale must be"):
        forgetting_attention(q, q, q, torch.zeros(1, 2, 8, device=DEVICE), q_scale=torch.ones(9, device=DEVICE))


def run_ssmax(B, H, T, d, dtype=torch.float32, window=0, docs=0, config=SMALL_TILES, tol=None, unfolded=False):
    """SSMax folded into the kernel as the attention folds it: q unscaled, its factor s_h log(n)
    (temperature.factor(term, grad=True)) to the kernel; the gradients of the unscaled q and of s_h
    against float64 autograd of the plain formula softmax((s_h log(n) q) k^T / sqrt(d) + bias) v.
    unfolded: s_h's gradient is held to twice the error of the path the fold replaces (q scaled in
    `dtype` first, the same kernel, autograd through the product) where that exceeds tol: s_h's
    gradient sums T x d signed terms, so in bf16 its error is the rounding of all of them."""
    torch.manual_seed(0)
    temp = QueryTemperature("ssmax", H).to(DEVICE)
    with torch.no_grad():
        temp.s.copy_(torch.linspace(0.43, 1.6, H))
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    bias = KerpleLog(H).to(DEVICE)
    segments = documents(B, T, docs)
    n = torch.arange(1, T + 1, device=DEVICE)
    term = temp.position_term(n.clamp(max=window) if window else n, torch.float32)
    out = biased_attention(q, k, v, bias.table(T, DEVICE), window=window, segments=segments, config=config,
                           q_scale=temp.factor(term, grad=True))
    do = torch.randn(B, H, T, d, device=DEVICE)
    grads = torch.autograd.grad(out, [q, k, v, temp.s], do.to(dtype))
    refs = [x.detach().double().requires_grad_() for x in (q, k, v, temp.s)]
    factor = refs[3][:, None] * term.double()
    ref = biased_softmax_reference(refs[0] * factor[..., None], refs[1], refs[2], bias.table(T, DEVICE).double(),
                                   window=window, segments=segments)
    ref_grads = torch.autograd.grad(ref, refs, do.double())
    names = ["out", "dq", "dk", "dv", "ds"]
    floors = one_key_floors(names, ref_grads[2]) if T == 1 else {}
    tol = tol or tolerance(dtype)
    if unfolded:
        scaled = q * temp.factor(term, grad=True).to(dtype)[..., None]
        plain = biased_attention(scaled, k, v, bias.table(T, DEVICE), window=window, segments=segments,
                                 config=config)
        ds_plain = torch.autograd.grad(plain, temp.s, do.to(dtype))[0]
        tol = {n: tol for n in names} | {"ds": max(tol, 2 * rel_err(ds_plain, ref_grads[3]))}
    compare(f"ssmax folded B{B} H{H} T{T} W{window} docs{docs} {dtype}", [out, *grads], [ref, *ref_grads], names,
            tol, floors)


@pytest.mark.parametrize("T,window,docs", [(1, 0, 0), (63, 0, 0), (111, 30, 0), (111, 0, 4)])
def test_ssmax_s_h_gradient_without_the_scaled_q(T, window, docs):
    """s_h's gradient through the factor's, which the dq kernel gives (per row, dS K / sqrt(d) . q),
    without a scaled q anywhere."""
    run_ssmax(2, 3, T, 16, window=window, docs=docs)


def test_ssmax_s_h_gradient_bound_by_the_unfolded_path():
    """The bound the bf16 GPU cases use (twice the unfolded path's error of s_h's gradient, or the
    tolerance where that is larger) holds in fp32 at several tiles."""
    run_ssmax(2, 3, 63, 16, window=30, unfolded=True)


# --- the 125m shape in bf16: the compiled kernels on a GPU --------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("shape,mode,window,docs", [("HT", "kerple", 0, 0), ("T", "table", 0, 0),
                                                    ("HT", "kerple", 129, 0), ("B1T", "kerple", 0, 8),
                                                    ("HT", "fox", 0, 0), ("T", "fox", 129, 8)])
def test_gpu_scaled_rows_125m(shape, mode, window, docs):
    run_scaled(2, 12, 1000, 64, shape, window, docs, mode, dtype=torch.bfloat16, config=None)


@pytest.mark.gpu
@pytest.mark.parametrize("window,docs", [(0, 0), (129, 8)])
def test_gpu_ssmax_folded_125m(window, docs):
    run_ssmax(2, 12, 1000, 64, torch.bfloat16, window, docs, config=None, unfolded=True)


@pytest.mark.gpu
def test_gpu_scaled_rows_fp32():
    run_scaled(2, 4, 300, 32, "BHT", 0, 0, "kerple", config=None)
