"""What a query temperature costs a training step (issue 42: "unchanged in speed"): the position
table is built once per forward for all the layers, q is scaled by one elementwise operator each way
(SSMax: one more, a reduction, for s_h), nothing of q's size is kept for the backward beyond the
scaled q the attention keeps, and the fused op's values and gradients are the plain ops'."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import V, assert_close, model_for
from lenx.attention.temperature import QueryTemperature

SHORT = dict(temp_train_len=8, temp_floor_scale=4.0, temp_attn_scale=0.3)
KINDS = ["ssmax", "logn", "l4temp"]


class Operators(TorchDispatchMode):
    """The aten operators dispatched below autograd that are not views or allocations (about one
    kernel each on a GPU)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not (func.is_view or func._opname in ("view", "_unsafe_view", "alias", "empty", "empty_strided",
                                                 "promote_types")):
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def step_operators(method: str, n_layer: int) -> list[str]:
    """The operators of a forward and backward of a float32 model of n_layer layers on 16 tokens."""
    model = model_for(method, n_layer=n_layer, **SHORT).float().train()
    idx = torch.randint(0, V, (2, 16))
    with Operators() as seen:
        model(idx, idx)[1].backward()
    return seen.ops


@pytest.mark.parametrize("kind,per_layer", [("ssmax", 6), ("logn", 2), ("l4temp", 2)])
def test_each_further_layer_adds_one_scaling_each_way(kind, per_layer, monkeypatch):
    """A layer's temperature: the product forward and its one backward (SSMax also s_h log n, [H, T],
    and s_h's product, sum and division); the table's operators come once. Measured: 0, 0 and 5 a
    layer beyond Kerple's (the contiguous scaled q spares the backend's copy of q each way); 9, 12 and
    12 before the table was shared and the product fused. s_h's reduction in the plain ops, as the
    CPU runs it (under Triton's interpreter its kernel would dispatch the interpreter's copies; on
    CUDA it is one launch and the partials' sum: the profiler test below)."""
    from lenx.ops.head_dot import route

    monkeypatch.setattr(route, "uses_triton", lambda x, y: False)
    extra = [len(step_operators(f"{kind}-kerple", n)) - len(step_operators("kerple", n)) for n in (1, 3)]
    assert (extra[1] - extra[0]) / 2 <= per_layer, extra


@pytest.mark.parametrize("kind", KINDS)
def test_the_table_is_built_once_per_forward(kind, monkeypatch):
    """Every layer of a forward (and of a prefill) takes the one table; a second forward builds its own."""
    calls = []
    term = QueryTemperature.position_term
    monkeypatch.setattr(QueryTemperature, "position_term", lambda self, *a: calls.append(1) or term(self, *a))
    model = model_for(f"{kind}-rope", n_layer=3, **SHORT)
    idx = torch.randint(0, V, (2, 12))
    with torch.no_grad():
        model(idx)
        assert len(calls) == 1
        model(idx)
        assert len(calls) == 2
        model.prefill(idx, model.new_cache(2, 12))
        assert len(calls) == 3


def test_layers_of_other_settings_take_their_own_table():
    """A layout's windowed layers count the window's keys: their table is not the global layers'."""
    model = model_for("logn-kerple", n_layer=4, layers="logn-kerple:w4,logn-kerple", temp_train_len=2)
    assert [b.attn.cfg.window for b in model.blocks] == [4, 0, 4, 0]
    idx = torch.randint(0, V, (1, 12))
    with torch.no_grad():
        x = model.wte(idx)
        for block in model.blocks:  # each layer alone: a table of its own
            x = block(x)
        assert torch.equal(model(idx)[0], model.lm_head(model.ln_f(x)))


def saved_during(fn):
    """The tensors autograd keeps for the backward while fn runs, and fn's result."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = fn()
    return saved, out


@pytest.mark.parametrize("kind", KINDS)
def test_nothing_of_q_s_size_is_kept_but_the_output(kind):
    """The backward keeps the table (and for SSMax the scaled q, which the attention keeps anyway, and
    s): not the input q (SSMax's old product kept it: for Kerple's kernels the whole qkv buffer), not
    an fp32 copy."""
    t = QueryTemperature(kind, 4, train_len=8, floor_scale=4.0)
    qkv = torch.randn(2, 64, 3, 4, 16, dtype=torch.bfloat16).permute(2, 0, 3, 1, 4).requires_grad_(False)
    q = qkv[0].detach().requires_grad_()
    term = t.position_term(torch.arange(1, 65), torch.float32)
    saved, y = saved_during(lambda: t(q, term=term))
    big = [s for s in saved if s.numel() >= q.numel()]
    assert all(s.untyped_storage().data_ptr() == y.untyped_storage().data_ptr() for s in big), \
        [(tuple(s.shape), s.dtype) for s in big]
    assert len(big) == int(kind == "ssmax")
    assert y.is_contiguous() and y.dtype == torch.bfloat16


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_values_and_gradients_are_the_plain_ops_bits(kind):
    """One rounding of the fp32 product to bf16, forward and backward, as `(q * f).to(q.dtype)` has it;
    SSMax's s_h gradient (read from the output) within bf16's rounding of the plain one."""
    t = QueryTemperature(kind, 4, train_len=8, floor_scale=4.0, attn_scale=0.3)
    with torch.no_grad():
        if t.s is not None:
            t.s.copy_(torch.tensor([0.5, 1.0, 1.5, 0.43]))
    q = torch.randn(2, 4, 40, 16, dtype=torch.bfloat16, requires_grad=True)
    term = t.position_term(torch.arange(1, 41), torch.float32)
    dy = torch.randn(2, 4, 40, 16, dtype=torch.bfloat16)
    y = t(q, term=term)
    got = torch.autograd.grad(y, [q] + list(t.parameters()), dy)
    factor = term[None, :] if t.s is None else t.s[:, None] * term
    want_y = (q * factor[..., None]).to(q.dtype)
    want = torch.autograd.grad(want_y, [q] + list(t.parameters()), dy)
    assert torch.equal(y, want_y) and torch.equal(got[0], want[0])
    if t.s is not None:
        assert_close(got[1], want[1], 1e-2, "ds")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(1, 2, 1, 3), (2, 3, 5, 4)])
def test_gradcheck_against_float64_finite_differences(kind, shape):
    B, H, T, d = shape
    t = QueryTemperature(kind, H, train_len=2, ssmax_init=0.7, floor_scale=2.0, attn_scale=0.3).double()
    n = torch.arange(1, T + 1) if B == 1 else torch.stack([torch.arange(1, T + 1) + 2 * b for b in range(B)])
    term = t.position_term(n, torch.float64)
    q = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    if t.s is None:
        assert torch.autograd.gradcheck(lambda q: t(q, term=term), (q,))
    else:
        s = (torch.rand(H, dtype=torch.float64) + 0.3).requires_grad_()
        call = torch.func.functional_call
        assert torch.autograd.gradcheck(lambda q, s: call(t, {"s": s}, (q,), {"term": term}), (q, s))


def test_the_model_s_scaled_q_is_s_h_log_n_q():
    """Through the module (its table from the forward's memo): row i of head h is s_h log(i + 1) q_i."""
    attn = model_for("ssmax-kerple", n_layer=1).blocks[0].attn
    x = torch.randn(1, 9, 16, dtype=torch.float64)
    q, _, _ = attn.project(x, memo={})
    f = attn.temperature.s[:, None] * torch.log(torch.arange(1, 10, dtype=torch.float64))
    assert_close(q, attn._qkv(x)[0] * f[..., None], 1e-14)


def folded_against_unfolded(method, device, monkeypatch, tol, backend="dense", documents=False):
    """A float32 layer with RoPE's fused kernel scaling q's rows as it rotates them out of the
    projection's output (rotate_qkv; heads-last for SDPA) against the same layer rotating with the
    plain ops and scaling after (float64 on the CPU), forward and every gradient (s_h's too).
    documents: two documents in the first sequence (per-sequence positions and factors)."""
    from lenx.attention import Attention, AttentionConfig
    from lenx.attention.rope import RoPE

    torch.manual_seed(0)
    ref = Attention(AttentionConfig(method=method, backend="dense", **SHORT), 3, 48).double()
    with torch.no_grad():
        if ref.temperature.s is not None:
            ref.temperature.s.copy_(torch.tensor([0.5, 1.0, 1.7]))
    layer = Attention(AttentionConfig(method=method, backend=backend, **SHORT), 3, 48).to(device)
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(2, 70, 48, dtype=torch.float64)
    docs = torch.tensor([[0] * 30 + [1] * 40, [0] * 70]) if documents else None
    scaled = []
    fused = RoPE.__dict__["fuses"]  # the staticmethod itself

    def spy(q):  # the fused kernel, and record that the temperature rode on it
        scaled.append(True)
        return True

    monkeypatch.setattr(RoPE, "fuses", staticmethod(spy))
    xs = x.float().to(device).requires_grad_()
    y = layer(xs, segments=None if docs is None else docs.to(device))
    q = layer.project(xs[:1, :5])[0]
    monkeypatch.setattr(RoPE, "fuses", fused)
    xr = x.clone().requires_grad_()
    want = ref(xr, segments=docs)
    assert scaled, "the layer did not fold the temperature into RoPE's kernel"
    node = q.grad_fn if ref.temperature.s is None else q.grad_fn.next_functions[0][0]  # under SSMax's s_h hook
    assert type(node).__name__ == "_RotateQKVBackward", "q was not scaled by the rotation of the projection"
    assert q.transpose(1, 2).is_contiguous() == (layer.backend_for(xs.device) == "sdpa")  # heads-last for SDPA
    assert_close(y.double().cpu(), want, tol, f"{method} forward")
    w = torch.randn_like(want)
    from lenx.ops.head_dot import triton as kernel

    launches, launch = [], kernel.head_dot  # s_h's reduction: the kernel, on the layout the backend left
    monkeypatch.setattr(kernel, "head_dot", lambda dy, y: launches.append(y.transpose(1, 2).is_contiguous())
                        or launch(dy, y))
    got_g = torch.autograd.grad((y * w.to(y)).sum(), [xs] + list(layer.parameters()))
    sdpa = layer.backend_for(xs.device) == "sdpa"
    assert launches == ([sdpa] if ref.temperature.s is not None else []), launches
    want_g = torch.autograd.grad((want * w).sum(), [xr] + list(ref.parameters()))
    for (name, _), a, b in zip([("x", None)] + list(layer.named_parameters()), got_g, want_g):
        assert_close(a.double().cpu(), b, tol, f"{method} d{name}")


FOLDS = [("ssmax-rope", "dense", False), ("logn-rope", "dense", False), ("l4temp-rope", "dense", False),
         ("ssmax-rope", "sdpa", False), ("l4temp-rope", "sdpa", True), ("ssmax-rope", "dense", True)]


@pytest.mark.parametrize("method,backend,documents", FOLDS)
def test_folded_into_rope_s_kernel_the_layer_is_the_reference(method, backend, documents, monkeypatch):
    """The fold's wiring on the CPU: the fused kernel under Triton's interpreter (conftest)."""
    pytest.importorskip("triton")
    folded_against_unfolded(method, "cpu", monkeypatch, 1e-5, backend, documents)


@pytest.mark.gpu
@pytest.mark.parametrize("method,backend,documents", FOLDS)
def test_gpu_folded_into_rope_s_kernel_the_layer_is_the_reference(method, backend, documents, monkeypatch):
    folded_against_unfolded(method, "cuda", monkeypatch, 1e-5, backend, documents)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_on_cuda_one_kernel_each_way_with_the_plain_ops_bits(kind):
    """On CUDA the product casts as it stores: one kernel forward, one backward (SSMax: its table
    s_h log n, and for s_h's gradient ops/head_dot's kernel and the sum of its partials), the plain
    ops' bits."""
    from torch.profiler import ProfilerActivity, profile

    t = QueryTemperature(kind, 12, train_len=64, floor_scale=64.0).cuda()
    qkv = torch.randn(4, 512, 3, 12, 64, device="cuda", dtype=torch.bfloat16).permute(2, 0, 3, 1, 4)
    q = qkv[0].detach().requires_grad_()
    term = t.position_term(torch.arange(1, 513, device="cuda"), torch.float32)
    dy = torch.randn(4, 12, 512, 64, device="cuda", dtype=torch.bfloat16)
    t(q, term=term).backward(dy)  # warm
    q.grad = None
    with profile(activities=[ProfilerActivity.CUDA]) as fwd:
        y = t(q, term=term)
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as bwd:
        y.backward(dy)
        torch.cuda.synchronize()
    kernels = [[e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA and "emcpy" not in e.name
                and "emset" not in e.name] for p in (fwd, bwd)]
    ssmax = kind == "ssmax"
    assert len(kernels[0]) <= 1 + ssmax, [e.name for e in kernels[0]]
    # backward: dq, and for SSMax the head_dot kernel, its partials' sum and the division by s_h
    # (gradient accumulation into the leaves q and s may add a copy each)
    assert len(kernels[1]) <= 1 + 3 * ssmax + 2, [e.name for e in kernels[1]]
    assert any("_head_dot_partials" in e.name for e in kernels[1]) == ssmax, [e.name for e in kernels[1]]
    factor = term[None, :] if t.s is None else t.s.detach()[:, None] * term
    assert torch.equal(y, (q.detach() * factor[..., None]).to(torch.bfloat16)) and y.is_contiguous()
    assert torch.equal(q.grad, (dy * factor[..., None]).to(torch.bfloat16))
