"""The sliding window (model.window) and document segments on every backend that takes them, against
a float64 reference whose mask is built by hand, entry by entry; forward and backward."""

from dataclasses import replace
import math

import pytest
import torch
from torch.nn import functional as F

from helpers import assert_close
from lenx.attention import Attention
from lenx.attention.backends import plan_backend, plan_note, run_backend
from lenx.config import AttentionConfig
from lenx.ops.stickbreaking.reference import stickbreaking_weights

H, D = 2, 16  # heads, head dim
METHODS = ["nope", "kerple", "alibi", "t5", "fire", "xl", "dapev2-kerple", "dapev2", "stickbreaking", "cope",
           "dapev2-stickbreaking-alibi", "mta", "mta-kerple"]


def layer(method, window, **kw):
    torch.manual_seed(0)
    attn = Attention(AttentionConfig(method=method, window=window, dape_hidden=4, cope_npos=8, **kw), H, H * D).double()
    with torch.no_grad():  # parts that start at zero would test nothing
        for p in attn.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return attn


def hand_seen(T, window, segments, B):
    """[B, T, T]: row i sees key j when j is among its `window` most recent (0: all) and in its document."""
    seen = torch.ones(B, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(T):
                if window and i - j >= window:
                    seen[b, i, j] = False
                if segments is not None and segments[b, i] != segments[b, j]:
                    seen[b, i, j] = False
    return seen


def hand_same(T, segments, B):
    """[B, T, T]: row i and key j are of one document (all True without segments)."""
    same = torch.ones(B, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(T):
                if segments is not None and segments[b, i] != segments[b, j]:
                    same[b, i, j] = False
    return same


def hand_attention(q, k, v, parts, seen, same=None, bias=None):
    """The parts' formulas with the mask `seen` [B, T, T] (and the causal cut) applied by hand; to a
    processor another document's keys (not `same`) do not exist, a window's are hidden. bias: the
    bias's block written by hand (None: the parts' own)."""
    T = q.shape[-2]
    pos = torch.arange(T)
    raw = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is None and parts.bias is not None:
        bias = parts.bias(pos, pos, q=q, k=k)
    if parts.processor is not None:
        scores = parts.processor(raw, bias, q, pos, pos, visible=seen, key_valid=same)
    else:
        scores = raw if bias is None else raw + bias
    if parts.normaliser.name == "stickbreaking":
        allowed = (pos[None, :] < pos[:, None]) & seen
        A, rem = stickbreaking_weights(scores, allowed[:, None])
        return A @ v, rem
    allowed = (pos[None, :] <= pos[:, None]) & seen
    probs = torch.softmax(scores.masked_fill(~allowed[:, None], -math.inf), -1)
    if parts.processor is not None and parts.processor.post_softmax:  # MTA's second convolution
        probs = parts.processor.after_softmax(probs, allowed[:, None], 0, same)
    return probs @ v, None


def operands(B, T, seed=1):
    torch.manual_seed(seed)
    return [torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True) for _ in range(3)]


def fox_sums(B, T, dtype=torch.float64):
    """A leaf c [B, H, T]: prefix sums of log forget gates, gentle (f near 0.95) so that far keys still weigh."""
    torch.manual_seed(2)
    return F.logsigmoid(3 + torch.randn(B, H, T, dtype=torch.float64)).cumsum(-1).to(dtype).requires_grad_()


def compare(backend, method, T, window, segments=None, chunk=16, B=2):
    attn = layer(method, window)
    parts = replace(attn.parts, segments=segments is not None)
    q, k, v = operands(B, T)
    if backend == "flex":  # no backward on the CPU
        q, k, v = (t.detach() for t in (q, k, v))
    leaves, hand_bias = [q, k, v], None
    if attn.bias is not None and attn.bias.per_token:  # FoX: its bias bound to prefix sums c, c_i - c_j by hand
        c = fox_sums(B, T)
        parts, hand_bias = replace(parts, bias=attn.bias.bind(c)), c[..., :, None] - c[..., None, :]
        leaves.append(c)
    out, rem = run_backend(backend, q, k, v, parts, chunk, segments)
    same = None if segments is None else hand_same(T, segments, B)
    ref, ref_rem = hand_attention(q, k, v, parts, hand_seen(T, window, segments, B), same, hand_bias)
    what = f"{backend} {method} T={T} W={window}"
    assert_close(out, ref, 1e-9, what)
    if ref_rem is not None:
        assert_close(rem, ref_rem, 1e-9, what + " rem")
    if backend == "flex":
        return
    weights = torch.randn_like(ref)
    grads = torch.autograd.grad((out * weights).sum(), leaves)
    ref_grads = torch.autograd.grad((ref * weights).sum(), leaves)
    for g, r, name in zip(grads, ref_grads, "qkvc"):
        assert_close(g, r, 1e-9, f"{what} d{name}", floor=1e-3)  # a gradient may be 0 (T = 1)


# windows of 1, W = T - 1, W > T, and windows ending mid-chunk (chunk 16)
@pytest.mark.parametrize("T,window", [(1, 1), (63, 1), (63, 62), (63, 5), (111, 23), (111, 200)])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_window_on_the_reference_paths(backend, method, T, window):
    compare(backend, method, T, window)


FOX = ["fox", "dapev2-fox", "stickbreaking-fox", "dape-fox"]


@pytest.mark.parametrize("T,window", [(1, 1), (63, 1), (63, 62), (111, 23), (111, 200)])
@pytest.mark.parametrize("method", FOX)
@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_window_on_fox_on_the_reference_paths(backend, method, T, window):
    """FoX's bias c_i - c_j (bound to its prefix sums) under a window: the hand-built mask, the
    gradient to c included."""
    compare(backend, method, T, window)


@pytest.mark.parametrize("T,window", [(1, 1), (63, 62), (111, 23)])
@pytest.mark.parametrize("method", ["nope", "rope"])
def test_window_on_sdpa(method, T, window):
    compare("sdpa", method, T, window)


@pytest.mark.parametrize("method", ["nope", "kerple", "alibi"])
def test_window_on_flex(method):
    pytest.importorskip("torch.nn.attention.flex_attention")
    compare("flex", method, 63, 9)


def test_the_chunked_path_reads_only_the_window(monkeypatch):
    """A window lets a block of rows skip the keys before it: the keys each block reads grow with W, not T."""
    from lenx.attention.backends import reference

    widths = []
    real = reference.block_attention

    def spy(q, k, v, parts, *where):
        widths.append(k.shape[-2])
        return real(q, k, v, parts, *where)

    monkeypatch.setattr(reference, "block_attention", spy)
    q, k, v = (t.detach() for t in operands(1, 200))
    run_backend("chunked", q, k, v, layer("dapev2-kerple", 20).parts, 16)
    assert max(widths) == 16 + 19 + 2  # the block, the window before it, the conv's halo both sides
    widths.clear()
    run_backend("chunked", q, k, v, layer("dapev2-kerple", 0).parts, 16)
    assert max(widths) == 200
    widths.clear()  # MTA: the block, its query halo of 5 + 5 rows above it and their window
    run_backend("chunked", q, k, v, layer("mta", 20).parts, 16)
    assert max(widths) == 16 + 10 + 19


def test_the_dape_conv_reads_zeros_at_a_window_edge():
    """At a window edge the DAPE V2 convolution reads the keys left of the window as it reads keys past
    the diagonal: zeros as conv1's input (scores and bias), conv1's output there read by conv2. Written
    out by hand with the conv weights, and nothing the row cannot see changes its output."""
    T, W = 12, 4
    attn = layer("dapev2-kerple", W)
    proc, parts = attn.processor, attn.parts
    q, k, v = (t.detach() for t in operands(1, T))
    pos = torch.arange(T)
    raw = q @ k.transpose(-1, -2) / math.sqrt(D)
    bias = parts.bias(pos, pos).expand_as(raw)
    hidden_keys = (pos[None, :] > pos[:, None]) | (pos[:, None] - pos[None, :] >= W)
    x = torch.cat([raw, bias], 1).masked_fill(hidden_keys, 0.0)
    w1, b1, w2, b2 = proc.conv_weights()
    half = w1.shape[-1] // 2
    f = F.conv2d(F.leaky_relu(F.conv2d(x, w1, b1, padding=(0, half)), 0.01), w2, b2, padding=(0, half))
    A = raw + bias + f
    seen = (pos[None, :] <= pos[:, None]) & ~hidden_keys
    ref = torch.softmax(A.masked_fill(~seen, -math.inf), -1) @ v
    out, _ = run_backend("chunked", q, k, v, parts, 5)
    assert_close(out, ref, 1e-12, "the conv at a window edge")
    k2, v2 = k.clone(), v.clone()
    k2[..., : T - W, :] += 3.0  # keys the last row cannot see
    v2[..., : T - W, :] -= 2.0
    out2, _ = run_backend("dense", q, k2, v2, parts)
    assert_close(out2[..., -1, :], out[..., -1, :], 1e-12, "the last row ignores keys left of its window")


def test_the_planner_routes_masked_work_to_the_fused_kernels(monkeypatch):
    """The fused kernels take a window and document ids for every composition they cover, DAPE V2's
    included (on its O(T)-memory kernel: tests/ops/test_dape_v2_masks.py), so masked work plans on
    them with no note; off CUDA it runs elsewhere."""
    from lenx.attention.backends import fused

    # judged as on a CUDA machine with triton, whatever this one has
    monkeypatch.setattr(fused.importlib.util, "find_spec", lambda name: object())
    cuda = torch.device("cuda")
    dape = layer("dapev2-kerple", 64).parts
    assert plan_backend(dape, cuda, "triton") == "triton" == plan_backend(dape, cuda)
    Attention(AttentionConfig(method="dapev2-kerple", window=8, backend="triton", dape_hidden=4), H, H * D)
    assert plan_backend(dape, torch.device("cpu")) == "chunked"
    assert plan_backend(layer("rope", 8).parts, torch.device("cpu")) == "sdpa"
    # masked plain softmax on CUDA: flex's block mask (skips hidden tiles) before SDPA's dense mask
    assert plan_backend(layer("rope", 8).parts, cuda) == "flex"
    assert plan_backend(replace(layer("rope", 0).parts, segments=True), cuda) == "flex"
    assert plan_backend(layer("rope", 0).parts, cuda) == "sdpa"
    assert plan_note(layer("dapev2-kerple", 0).parts, cuda) is None
    assert plan_note(dape, cuda) is None
    assert plan_backend(replace(dape, segments=True), cuda) == "triton"
    # the biased-softmax, FoX, stick-breaking and DAPE V2 kernels take both masks
    for method in ("kerple", "kerple-power", "alibi", "t5", "stickbreaking", "fox", "dapev2-kerple"):
        masked = replace(layer(method, 8).parts, segments=True)
        assert plan_note(masked, cuda) is None and plan_backend(masked, cuda) == "triton", method
    assert plan_backend(layer("kerple", 8).parts, torch.device("cpu")) == "chunked"
    # what a run's meta.json and `lenx bench --train-step` record
    from helpers import model_for
    assert model_for("dapev2-kerple", window=8, d_model=32).backend_notes(cuda) == []
    assert model_for("kerple", window=8, d_model=32).backend_notes(cuda) == []


@pytest.mark.parametrize("window,causal", [(-1, True), (4, False)])
def test_a_bad_window_is_refused(window, causal):
    with pytest.raises(ValueError, match="window"):
        Attention(AttentionConfig(method="alibi", window=window, causal=causal), H, H * D)


def test_the_chunked_memory_estimate_follows_the_window():
    from lenx.attention.backends import Work, get_backend

    chunked = get_backend("chunked")
    work = Work(batch=1, heads=H, length=8192, head_dim=D, chunk_size=256)
    windowed, wide = (chunked.memory(layer("kerple", w).parts, work).peak for w in (256, 0))
    assert windowed * 8192 // 512 == pytest.approx(wide, rel=0.01)  # keys per block: 256 + 256, not 8192


@pytest.mark.parametrize("T,window,docs", [(1, 1, False), (63, 62, True), (111, 23, False), (111, 0, True)])
def test_stickbreaking_masks_on_the_fused_kernels(T, window, docs):
    """The planner's triton backend for stick-breaking with a window and/or documents (Triton's
    interpreter on the CPU, fp32) against the hand-built float64 reference."""
    pytest.importorskip("triton")
    B = 2
    segments = torch.tensor([[0] * (T // 3) + [1] * (T - T // 3), [0] * T]) if docs else None
    parts = replace(layer("stickbreaking", window).parts, segments=docs)
    q, k, v = (t.detach().float().requires_grad_() for t in operands(B, T))
    out, rem = run_backend("triton", q, k, v, parts, 16, segments)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, ref_rem = hand_attention(q64, k64, v64, parts, hand_seen(T, window, segments, B))
    assert_close(out, ref, 1e-4, "out")
    assert_close(rem, ref_rem, 1e-4, "rem")
    weights = torch.randn_like(ref)
    grads = torch.autograd.grad((out * weights.float()).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * weights).sum(), (q64, k64, v64))
    for g, r, name in zip(grads, ref_grads, "qkv"):
        assert_close(g, r, 1e-4, f"d{name}", floor=1e-3)


@pytest.mark.parametrize("method,T,window,docs", [("kerple", 1, 1, False), ("alibi", 63, 62, True),
                                                  ("t5", 111, 23, False), ("kerple-power", 111, 0, True),
                                                  ("kerple", 111, 40, True)])
def test_biased_masks_on_the_fused_kernels(method, T, window, docs):
    """The planner's triton backend for a per-distance bias with a window and/or documents (Triton's
    interpreter on the CPU, fp32; Fused.run passes both) against the hand-built float64 reference,
    the bias parameters' gradients included."""
    pytest.importorskip("triton")
    B = 2
    segments = torch.tensor([[0] * (T // 3) + [1] * (T - T // 3), [4] * T]) if docs else None
    attn = layer(method, window).float()
    parts = replace(attn.parts, segments=docs)
    params = list(parts.bias.parameters())
    q, k, v = (t.detach().float().requires_grad_() for t in operands(B, T))
    out, rem = run_backend("triton", q, k, v, parts, 16, segments)
    assert rem is None
    grads = torch.autograd.grad((out * 1.0).sum() + (out ** 2).sum(), [q, k, v] + params)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    parts64 = replace(layer(method, window).parts, segments=docs)
    ref, _ = hand_attention(q64, k64, v64, parts64, hand_seen(T, window, segments, B))
    ref_grads = torch.autograd.grad(ref.sum() + (ref ** 2).sum(), [q64, k64, v64] + list(parts64.bias.parameters()))
    assert_close(out, ref, 1e-4, "out")
    # T = 1: the output is v whatever the scores, every other gradient exactly 0 (rounding noise: floor)
    floor = ref_grads[2].norm().item() if T == 1 else 1e-3
    for g, r, name in zip(grads, ref_grads, ["q", "k", "v"] + [f"bias{i}" for i in range(len(params))]):
        assert_close(g, r, 1e-4, f"{method} d{name}", floor=floor)


@pytest.mark.parametrize("T,window,docs", [(1, 1, False), (63, 62, True), (111, 23, True), (111, 200, False)])
def test_fox_masks_on_the_fused_kernel(T, window, docs):
    """The planner's triton backend for FoX with a window and/or documents (Triton's interpreter on
    the CPU, fp32; Fused.run passes both with c) against the hand-built float64 reference, dc included."""
    pytest.importorskip("triton")
    B = 2
    segments = torch.tensor([[0] * (T // 3) + [1] * (T - T // 3), [4] * T]) if docs else None
    attn = layer("fox", window).float()
    c = fox_sums(B, T, torch.float32)
    parts = replace(attn.parts, bias=attn.bias.bind(c), segments=docs)
    q, k, v = (t.detach().float().requires_grad_() for t in operands(B, T))
    out, rem = run_backend("triton", q, k, v, parts, 16, segments)
    assert rem is None
    weights = torch.randn_like(out, dtype=torch.float64)
    grads = torch.autograd.grad((out * weights.float()).sum(), (q, k, v, c))
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, c)]
    ref, _ = hand_attention(*leaves[:3], parts, hand_seen(T, window, segments, B),
                            bias=leaves[3][..., :, None] - leaves[3][..., None, :])
    ref_grads = torch.autograd.grad((ref * weights).sum(), leaves)
    assert_close(out, ref, 1e-4, "out")
    floor = ref_grads[2].norm().item() if T == 1 else 1e-3  # T = 1: every gradient but dv is 0 up to rounding
    for g, r, name in zip(grads, ref_grads, "qkvc"):
        assert_close(g, r, 1e-4, f"fox d{name}", floor=floor)
