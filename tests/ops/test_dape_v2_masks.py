"""DAPE V2's O(T)-memory Triton kernels (lenx.ops.dape_v2.triton) with a window and document ids,
against a float64 reference with the mask built by hand here: the output and every gradient (q, k,
v, the bias table, both convs' weights and biases). The rule (attention/masks.py): a key a mask
hides is one past the causal edge to the convolutions (conv1's input zero there), another
document's key does not exist (conv1's output zero there too). Without CUDA the kernels run under
Triton's interpreter with small tiles (16 query rows, 16-key windows: 8 outputs each at k 3), so
at T 63 and 111 whole windows are skipped and windows' edges fall inside tiles."""

import math

import pytest
import torch

from helpers import rel_err
from kernel_cases import CUDA, DEVICE, bias_table, bounds_checked, compare, log_errors, one_key_floors, tolerance
from lenx.ops.biased_softmax.reference import masked_softmax, table_bias
from lenx.ops.dape_v2.reference import dape_v2_scores

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from lenx.ops import tiles  # noqa: E402
from lenx.ops.dape_v2 import triton as kernel  # noqa: E402

SMALL = {"tiles": (16, 16, 4, 1)}  # k <= 3; k 5 and 7 need 32-key windows
SMALL_WIDE = {"tiles": (16, 32, 4, 1)}


def document_ids(B, T, docs, seed=0):
    """[B, T] ids of `docs` documents of random lengths, one of length 1 where T allows (two cuts
    side by side); the second sequence's ids are other integers, in two runs of one id apart."""
    if not docs:
        return None
    g = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randperm(T - 1, generator=g)[:docs - 1].add(1).tolist()) if T > 1 else []
    if T > 2 and docs > 2:
        cuts = sorted(set(cuts[:-1] + [cuts[0] + 1 if cuts[0] + 1 < T else cuts[0] - 1]))
    ids = torch.zeros(T, dtype=torch.long)
    for c in cuts:
        ids[c:] += 1
    other = 7 + ids.flip(0)
    other[: T // 3] = 7 + ids[-1]  # the first third joins the last document's id: one document, two runs
    return torch.stack([ids, other][:B]).to(DEVICE)


def masked_reference(q, k, v, w1, b1, w2, b2, table, window, segments):
    """softmax over the visible keys of S + Bias + f(tril([S; Bias])), the mask built by hand: visible =
    causal, within the window, same document; conv1 reads zeros at hidden keys; conv1's output is
    zero at another document's keys (dape_v2_scores' key_valid)."""
    B, T = q.shape[0], q.shape[-2]
    pos = torch.arange(T, device=q.device)
    S = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    bias = table_bias(table, pos, pos) if table is not None else None
    seen = torch.ones(B, T, T, dtype=torch.bool, device=q.device)
    if window:
        seen = seen & (pos[:, None] - pos[None, :] < window)
    same = None
    if segments is not None:
        same = segments[:, :, None] == segments[:, None, :]
        seen = seen & same
    A = dape_v2_scores(S, bias, w1, b1, w2, b2, pos, pos, key_valid=same, visible=seen)
    return masked_softmax(A, v, (pos[None, :] <= pos[:, None]) & seen[:, None])


def operands(B, H, T, d, D, ks, kind, dtype):
    """q . k / sqrt(d) near +3 for every pair, so each key a row could see carries a real share (a
    key let through moves the output), and conv weights big enough that the conv's reach matters."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, d, device=DEVICE) for _ in range(3))
    q, k = 0.3 * q + 3 / d ** 0.5, 0.3 * k + 1.0
    table = bias_table(kind, H, T)
    if table is not None:
        table = (0.1 * table).detach()
    C = 2 * H if table is not None else H
    w = [torch.randn(D, C, 1, ks) * 0.4, torch.randn(D) * 0.2, torch.randn(H, D, 1, ks) * 0.4, torch.randn(H) * 0.1]
    leaves = [x.to(dtype).requires_grad_() for x in (q, k, v)]
    params = [x.to(DEVICE).requires_grad_() for x in w]
    return leaves, ([table.requires_grad_()] if table is not None else []), params


def run_masked(B, H, T, d, ks, D, kind, window, docs, dtype=torch.float32, config=SMALL):
    leaves, tab, params = operands(B, H, T, d, D, ks, kind, dtype)
    segments = document_ids(B, T, docs)
    do = torch.randn(B, H, T, d, device=DEVICE)
    out = kernel.dape_v2_triton(*leaves, *params, *(tab or [None]), config=config, window=window, segments=segments)
    grads = torch.autograd.grad(out, leaves + tab + params, do.to(dtype))
    ref_dtype = torch.float32 if CUDA else torch.float64  # float64 maps of T 4096 would not fit
    refs = [x.detach().to(ref_dtype).requires_grad_() for x in leaves + tab + params]
    ref = masked_reference(*refs[:3], *refs[-4:], refs[3] if tab else None, window, segments)
    ref_grads = torch.autograd.grad(ref, refs, do.to(ref_dtype))
    names = ["out", "dq", "dk", "dv"] + (["dtable"] if tab else []) + ["dw1", "db1", "dw2", "db2"]
    floors = {"db2": ref_grads[-2].norm().item()}  # the softmax ignores conv2's bias: exactly 0
    if ks == 1:  # each row of dS sums to 0: where conv1's outputs are all > 0 (these scores) b1's is 0 too
        floors["db1"] = ref_grads[-4].norm().item()
    if T == 1 or window == 1:
        floors = one_key_floors(names, ref_grads[2])
    tol = tolerance(dtype)
    if dtype != torch.float32:
        # bf16 conv operands: hold the kernel to eager PyTorch's own bf16 error (1.5x, or 1e-2), as
        # tests/ops/test_dape_v2.py does; conv1's gradients are sums of largely cancelling terms
        with torch.autocast(DEVICE.type, dtype=dtype):
            base = masked_reference(*leaves, *params, tab[0] if tab else None, window, segments)
        base_grads = torch.autograd.grad(base, leaves + tab + params, do.to(dtype))
        errs = [rel_err(a, b, floors.get(n, 1e-6)) for n, a, b in zip(names, [base, *base_grads], [ref, *ref_grads])]
        tol = {n: max(tol, 1.5 * e) for n, e in zip(names, errs)}
        log_errors({"case": f"bf16 eager baseline, masked dapev2 T{T} W{window} docs{docs}", "errors": dict(zip(names, errs))})
    compare(f"dapev2 masked B{B} H{H} T{T} d{d} k{ks} D{D} {kind} W{window} docs{docs} {dtype}", [out, *grads],
            [ref, *ref_grads], names, tol, floors)


# windows of 1, 5, T - 1, > T, ending mid-tile (40: 16-row blocks, 8 outputs a window) and on a
# tile edge (32)
@pytest.mark.parametrize("T,window", [(1, 1), (63, 1), (63, 5), (63, 62), (63, 200), (111, 40), (63, 32)])
def test_window(T, window):
    run_masked(1, 2, T, 16, 3, 4, "kerple", window, 0)


@pytest.mark.parametrize("T,docs,B", [(1, 1, 2), (63, 5, 2), (111, 9, 2), (63, 1, 1)])
def test_documents(T, docs, B):
    run_masked(B, 2, T, 16, 3, 4, "alibi", 0, docs)


@pytest.mark.parametrize("T,ks,kind,window,docs,config", [
    (111, 3, "t5", 37, 4, SMALL),  # both masks, the second sequence's document in two runs
    (63, 3, None, 0, 4, SMALL),  # no bias channels
    (111, 5, "kerple", 21, 3, SMALL_WIDE),  # conv reach 2 (4 keys of halo)
    (70, 7, "alibi", 9, 0, SMALL_WIDE),
    (63, 1, "kerple", 5, 3, SMALL),  # DAPE v1: no reach across keys
])
def test_masked_compositions(T, ks, kind, window, docs, config):
    run_masked(2, 2, T, 16, ks, 4, kind, window, docs, config=config)


def test_masked_default_tiles_and_two_pass_dkdv():
    """The default fp32 tiles (16 rows, 16-key windows at k 3 with fp32 convs), and the dK/dV pass
    split in two (wide tiles on the GPU)."""
    run_masked(1, 2, 80, 16, 3, 4, "kerple", 23, 3, config=None)
    run_masked(1, 2, 80, 16, 3, 4, "kerple", 23, 3, config={**SMALL, "split_dkdv": True})


@pytest.mark.skipif(CUDA, reason="the interpreter's loads and stores")
def test_masked_loads_stay_inside_the_tensors():
    with bounds_checked():
        run_masked(2, 2, 45, 16, 3, 4, "kerple", 11, 4)


def test_masked_rejects_bad_arguments():
    (q, k, v), tab, w = operands(1, 2, 8, 16, 4, 3, "kerple", torch.float32)
    with pytest.raises(ValueError, match="window must be an int"):
        kernel.dape_v2_triton(q, k, v, *w, tab[0], window=-1)
    with pytest.raises(ValueError, match="segments must be integer document ids"):
        kernel.dape_v2_triton(q, k, v, *w, tab[0], segments=torch.zeros(1, 8, device=DEVICE))


# Kernel pieces with one edge wrong, for the mutation test below (the interpreter reads the module's
# globals at each call, so patching them swaps the piece in).
@triton.jit
def _wide_window(allowed, row, col, row_doc, DOC, T, WIN, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    return tiles.window_document(allowed, row, col, row_doc, DOC, T, WIN + 1, HAS_W, HAS_SEG)  # one key too many


@triton.jit
def _no_documents(allowed, row, col, row_doc, DOC, T, WIN, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    return tiles.window_document(allowed, row, col, row_doc, DOC, T, WIN, HAS_W, False)  # across documents


@triton.jit
def _late_start(m0, rows, T, WIN, DOC, BN: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    return tiles.key_start(m0, rows, T, WIN, DOC, BN, HAS_W, HAS_SEG) + 8  # skips one window's outputs


_ROW_END = kernel._row_end


@triton.jit
def _short_end(own0, keys, own, T, WIN, LAST, OWN: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    return _ROW_END(own0, keys, own, T, WIN, LAST, OWN, HAS_W, HAS_SEG) - 16  # one row block short


@pytest.mark.skipif(CUDA, reason="patches the kernels' module globals, which only the interpreter reads at each call")
@pytest.mark.parametrize("piece,wrong,window,docs", [
    ("window_document", _wide_window, 20, 0), ("window_document", _no_documents, 0, 5),
    ("key_start", _late_start, 20, 0), ("key_start", _late_start, 0, 5),
    ("_row_end", _short_end, 20, 0), ("_row_end", _short_end, 0, 5),
])
def test_a_wrong_edge_fails(monkeypatch, piece, wrong, window, docs):
    """The tests see one edge wrong: a key let through past the window or across a document, a
    window of keys skipped that a row needs, the key-owner kernel stopping a row block early."""
    monkeypatch.setattr(kernel, piece, wrong)
    # (a late start leaves the first rows no key at all: their log-sum-exp, and dK from it, not finite)
    with pytest.raises(AssertionError, match="over tolerance|non-finite"):
        run_masked(1, 2, 63, 16, 3, 4, "kerple", window, docs)


@pytest.mark.parametrize("window,docs,later", [(0, True, 32), (20, False, 64)])
def test_keys_out_of_reach_are_never_read(window, docs, later):
    """Documents of 32 tokens, or a window of 20: the kernels never read the keys of an earlier
    document or before a block's window, less the conv's halo (cost O(the documents) or O(W), not
    O(T)): NaNs in q, k, v at positions 0..27 reach none of the outputs and gradients from `later`
    on (rows 64.. see keys 45.. and read 43.. through the halo), which match the reference's."""
    T = 96
    segments = (torch.arange(T, device=DEVICE) // 32)[None].expand(2, T) if docs else None
    (q, k, v), tab, w = operands(2, 2, T, 16, 4, 3, "kerple", torch.float32)
    ref = [x.detach().double().requires_grad_() for x in (q, k, v)]
    with torch.no_grad():
        for x in (q, k, v):
            x[..., :28, :] = float("nan")
    do = torch.randn(2, 2, T, 16, device=DEVICE)
    out = kernel.dape_v2_triton(q, k, v, *w, tab[0], config=SMALL, window=window, segments=segments)
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref_out = masked_reference(*ref, *(x.detach().double() for x in w), tab[0].detach().double(), window, segments)
    ref_grads = torch.autograd.grad(ref_out, ref, do.double())
    at = slice(later, None)
    compare(f"dapev2 out of reach W{window} docs{docs}", [out[..., at, :], *(g[..., at, :] for g in grads)],
            [ref_out[..., at, :], *(g[..., at, :] for g in ref_grads)], ["out", "dq", "dk", "dv"], 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("T,window,docs", [(1000, 1, 0), (1000, 129, 0), (1000, 0, 8), (4096, 512, 0),
                                           (4096, 700, 8)])
def test_gpu_dape_masked(T, window, docs):
    """The 125m shape's heads per tile (H 12, d 64, hidden 32) in bf16 with the default tiles."""
    run_masked(1, 12, T, 64, 3, 32, "kerple", window, docs, dtype=torch.bfloat16, config=None)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,ks", [(torch.float32, 3), (torch.bfloat16, 5)])
def test_gpu_dape_masked_default_tiles(dtype, ks):
    """fp32 inputs where they fit (k 3, d 32: 16-key windows) and k 5's 32-key windows in bf16."""
    run_masked(2, 4, 1000, 32, ks, 16, "alibi", 300, 6, dtype=dtype, config=None)


def test_fp32_inputs_beyond_its_shared_memory_are_refused_and_routed_to_chunked():
    """fp32 tiles at k 5 or head dim 64 overflow the kernel's shared memory on sm_90 (offline
    compiles: 262-336 KB of 227): the op says so in one line before launching anything, and the
    fused backend's masked route (and its memory estimate) takes the chunked reference instead."""
    from lenx.attention import DapeV2, KerpleLog, Softmax
    from lenx.attention.backends import Parts, Work, fused
    from lenx.attention.backends.reference import Chunked

    for ks, d in ((5, 32), (3, 64)):
        leaves, tab, params = operands(1, 4, 20, d, 8, ks, "kerple", torch.float32)
        if CUDA:  # the interpreter has no shared memory to overflow
            with pytest.raises(ValueError, match="fp32 inputs fit the fused DAPE V2 kernel only at kernel_size <= 3"):
                kernel.dape_v2_triton(*leaves, *params, *tab, window=7)
        assert "fp32 inputs fit" in kernel.shape_unsupported_reason(4, d, 8, ks, dtype=torch.float32)
        assert kernel.shape_unsupported_reason(4, d, 8, ks, dtype=torch.bfloat16) is None
        parts = Parts(KerpleLog(4), DapeV2(4, 8, ks), Softmax(), head_dim=d, window=7)
        q = torch.zeros(1, 4, 20, d)
        assert fused._route(q, q, q, parts)[0] == "chunked"
        assert fused._route(q.bfloat16(), q.bfloat16(), q.bfloat16(), parts)[0] == "triton"
        assert fused._wide(parts.processor, d, torch.float32) and not fused._wide(parts.processor, d)
        assert fused.Fused().memory(parts, Work(1, 4, 20, d, itemsize=4)) == \
            Chunked().memory(parts, Work(1, 4, 20, d, itemsize=4))


# --- routing: masked DAPE V2 work goes to this kernel, never to the Gluon forward or the skewed kernels


@pytest.mark.parametrize("grad", [True, False])
def test_masked_work_routes_to_the_triton_kernel(monkeypatch, grad):
    """The fused backend with a window and document ids: the O(T) Triton kernel, training and forward
    only, where unmasked work would take the Gluon forward or the skewed kernels (on the CPU
    _skewed_plan picks them; the Gluon forward is forced here); its kernel_note says why. The
    output and gradients match the dense reference with the same masks."""
    from dataclasses import replace

    from lenx.attention import DapeV2, KerpleLog, Softmax
    from lenx.attention.backends import Parts, dense_attention, fused, run_backend

    monkeypatch.setattr(fused, "_use_gluon", lambda q, proc: True)
    torch.manual_seed(0)
    H, T = 2, 40
    parts = Parts(KerpleLog(H).to(DEVICE), DapeV2(H, 4, 3).to(DEVICE), Softmax(), head_dim=16)
    q, k, v = (torch.randn(2, H, T, 16, device=DEVICE, requires_grad=grad) for _ in range(3))
    assert fused.forward_kernel(q, k, v, parts) in ("skewed", "gluon")  # unmasked: the others
    segments = document_ids(2, T, 4)
    masked = replace(parts, window=11, segments=True)
    with torch.set_grad_enabled(grad):
        assert fused.forward_kernel(q, k, v, masked) == "triton"
        assert masked.processor.kernel_note == "a window and document segments: the Gluon forward and the skewed " \
                                               "kernels take no mask"
        out, _ = run_backend("triton", q, k, v, masked, segments=segments)
        ref, _ = dense_attention(q, k, v, masked, segments)
    assert masked.processor.kernel == "triton"
    outs, refs = [out], [ref]
    if grad:
        up = torch.randn_like(out)
        outs += torch.autograd.grad(out, (q, k, v), up)
        refs += torch.autograd.grad(ref, (q, k, v), up)
    compare(f"routed masked dapev2 grad={grad}", outs, refs, ["out", "dq", "dk", "dv"][:len(outs)], 1e-4)


def test_masked_head_dim_128_runs_the_chunked_reference():
    """Head dim 128, which the Triton kernel cannot take, masked: the chunked reference (the skewed
    kernels, which take it unmasked, take no mask), the mask applied."""
    from lenx.attention import DapeV2, KerpleLog, Softmax
    from lenx.attention.backends import Parts, dense_attention, fused, run_backend

    torch.manual_seed(0)
    parts = Parts(KerpleLog(2).to(DEVICE), DapeV2(2, 4, 3).to(DEVICE), Softmax(), head_dim=128, window=5,
                  segments=True)
    q, k, v = (torch.randn(1, 2, 19, 128, device=DEVICE) for _ in range(3))
    segments = document_ids(1, 19, 3)
    assert fused.forward_kernel(q, k, v, parts) == "chunked"
    out, _ = run_backend("triton", q, k, v, parts, segments=segments)
    ref, _ = dense_attention(q, k, v, parts, segments)
    assert (out - ref).abs().max() < 1e-5
