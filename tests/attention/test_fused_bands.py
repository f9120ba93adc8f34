"""The fused biased-softmax path's host work a call (lenx.ops.biased_softmax.bands, backends/fused.py):
Kerple's and ALiBi's bands are kept between calls while the bias's tensors are unchanged, rebuilt when
they change, and a warm call builds neither table nor band. Without CUDA under Triton's interpreter."""

import gc
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton")

from lenx.attention import ALiBi, KerpleLog, Softmax, T5Bias  # noqa: E402
from lenx.attention.backends import Parts, dense_attention, fused, run_backend  # noqa: E402
from lenx.ops.biased_softmax import bands as kept  # noqa: E402
from lenx.ops.biased_softmax import triton as kernel  # noqa: E402
from kernel_cases import DEVICE, compare  # noqa: E402

B, H, T, D, W = 1, 2, 23, 16, 5  # odd T, a window ending mid-tile


def _call(parts, leaves, q, k, v, up):
    out, _ = run_backend("triton", q, k, v, parts)
    return [out, *torch.autograd.grad(out, leaves, up)]


def _reference(parts, leaves, q, k, v, up):
    """The dense reference in float64, on float64 copies of the inputs and the bias."""
    bias64 = type(parts.bias)(H).to(DEVICE).double()
    bias64.load_state_dict(parts.bias.state_dict())
    parts64 = Parts(bias64, None, Softmax(), window=parts.window)
    x64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out, _ = dense_attention(*x64, parts64)
    return [out, *torch.autograd.grad(out, x64 + list(bias64.parameters()), up.double())]


def test_kerple_bands_are_kept_and_follow_parameter_updates():
    torch.manual_seed(0)
    parts = Parts(KerpleLog(H).to(DEVICE), None, Softmax(), window=W)
    q, k, v = (torch.randn(B, H, T, D, device=DEVICE, requires_grad=True) for _ in range(3))
    up = torch.randn(B, H, T, D, device=DEVICE)
    leaves = [q, k, v, *parts.bias.parameters()]
    names = ["out", "dq", "dk", "dv", "dr1", "dr2"]
    builds, hits = kept.stats["builds"], kept.stats["hits"]
    first = _call(parts, leaves, q, k, v, up)
    second = _call(parts, leaves, q, k, v, up)
    assert kept.stats["builds"] == builds + 1 and kept.stats["hits"] == hits + 1
    assert all(torch.equal(a, b) for a, b in zip(first, second))  # the kept bands are the built ones
    compare("kerple kept bands", second, _reference(parts, leaves, q, k, v, up), names, 1e-4)
    with torch.no_grad():  # an in-place update bumps the version
        parts.bias.r1.add_(0.3)
        parts.bias.r2.mul_(1.5)
    third = _call(parts, leaves, q, k, v, up)
    assert kept.stats["builds"] == builds + 2
    compare("kerple after an update", third, _reference(parts, leaves, q, k, v, up), names, 1e-4)
    assert not torch.allclose(third[0], second[0])


@pytest.mark.parametrize("how", [dict(fused=True), dict(foreach=False)])
def test_bands_follow_an_optimizer_step(how):
    """torch's fused AdamW (lenx's default on CUDA) writes the parameters without bumping _version,
    the stamp the bands are kept by: they follow its steps all the same (lenx.ops.kept empties its
    stores after every step), in the training call and in a no-grad call between steps."""
    torch.manual_seed(0)
    parts = Parts(KerpleLog(H).to(DEVICE), None, Softmax(), window=W)
    q, k, v = (torch.randn(B, H, T, D, device=DEVICE, requires_grad=True) for _ in range(3))
    up = torch.randn(B, H, T, D, device=DEVICE)
    leaves = [q, k, v, *parts.bias.parameters()]
    opt = torch.optim.AdamW(parts.bias.parameters(), lr=0.2, **how)
    outs = []
    for step in range(3):
        got = _call(parts, leaves, q, k, v, up)
        compare(f"kerple at step {step}", got, _reference(parts, leaves, q, k, v, up),
                ["out", "dq", "dk", "dv", "dr1", "dr2"], 1e-4)
        with torch.no_grad():
            assert torch.allclose(run_backend("triton", q, k, v, parts)[0], got[0], atol=1e-6)
        for p, g in zip(parts.bias.parameters(), got[4:]):
            p.grad = g
        opt.step()
        outs.append(got[0])
    assert not torch.allclose(outs[0], outs[-1])  # the steps moved the bias


def test_bands_kept_under_inference_mode_are_not_saved_for_a_backward():
    """Evaluation under torch.inference_mode between two training steps keeps inference tensors, which
    a backward cannot save: the next call with grad rebuilds them (and its backward runs)."""
    parts = Parts(KerpleLog(H).to(DEVICE), None, Softmax(), window=W)
    q, k, v = (torch.randn(B, H, T, D, device=DEVICE, requires_grad=True) for _ in range(3))
    with torch.inference_mode():
        run_backend("triton", q.detach(), k.detach(), v.detach(), parts)
        builds = kept.stats["builds"]
        run_backend("triton", q.detach(), k.detach(), v.detach(), parts)
        assert kept.stats["builds"] == builds  # kept for the next evaluation
    leaves = [q, k, v, *parts.bias.parameters()]
    grads = _call(parts, leaves, q, k, v, torch.randn(B, H, T, D, device=DEVICE))
    assert kept.stats["builds"] == builds + 1 and all(torch.isfinite(g).all() for g in grads)


def test_a_warm_call_builds_no_table_and_no_band(monkeypatch):
    """Kerple fwd+bwd (bf16) with its bands kept: no table ops (arange, log1p), no band launch; and
    the launcher's own host ops trimmed: one cast for rowsum(dO * O), no dummy-pointer selects of q."""
    parts = Parts(KerpleLog(H).to(DEVICE), None, Softmax(), window=W)
    q, k, v = (torch.randn(B, H, T, D, device=DEVICE, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    up = torch.randn(B, H, T, D, device=DEVICE, dtype=torch.bfloat16)
    leaves = [q, k, v, *parts.bias.parameters()]
    _call(parts, leaves, q, k, v, up)  # builds and keeps the bands, the transposed one included
    built = []
    monkeypatch.setattr(kept, "build_band", lambda *a, **kw: built.append(1))
    launching = []
    if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter's own torch ops are the kernels' work
        from triton.runtime import interpreter

        run = interpreter.InterpretedFunction.run

        def quiet(self, *a, **kw):
            launching.append(1)
            try:
                return run(self, *a, **kw)
            finally:
                launching.pop()

        monkeypatch.setattr(interpreter.InterpretedFunction, "run", quiet)

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not launching:
                self.ops.append((func.__name__.split(".")[0], [a.dim() for a in args if isinstance(a, torch.Tensor)]))
            return func(*args, **(kwargs or {}))

    with Ops() as mode:
        _call(parts, leaves, q, k, v, up)
    names = [name for name, _ in mode.ops]
    assert not built and "log1p" not in names and "arange" not in names, names
    assert names.count("_to_copy") == 1, names
    assert not [s for name, s in mode.ops if name == "select" and 4 in s], mode.ops


def test_which_tables_are_kept():
    """Kept: Kerple (its parameters get their gradients from the kernel) and a bias with nothing to
    train (ALiBi); not T5's table, whose gradient the kernel gives (it is built in the graph)."""
    q = torch.randn(B, H, T, D, device=DEVICE)
    kerple, alibi, t5 = KerpleLog(H).to(DEVICE), ALiBi(H).to(DEVICE), T5Bias(H).to(DEVICE)
    assert isinstance(fused._kept_bands(q, kerple, kerple.fused_grad_args()), kept.Bands)
    with torch.no_grad():
        assert isinstance(fused._kept_bands(q, kerple, {}), kept.Bands)
    assert isinstance(fused._kept_bands(q, alibi, alibi.fused_grad_args()), kept.Bands)
    assert fused._kept_bands(q, t5, t5.fused_grad_args()) is None
    with torch.no_grad():
        assert isinstance(fused._kept_bands(q, t5, t5.fused_grad_args()), kept.Bands)


def test_a_frozen_t5_bias_runs_on_kept_bands():
    """T5 with its parameters frozen, q, k, v needing gradients: its table gets none, so its bands are
    kept, and the table-gradient shortcut (tail) is not passed without a table."""
    parts = Parts(T5Bias(H).to(DEVICE).requires_grad_(False), None, Softmax(), window=W)
    q, k, v = (torch.randn(B, H, T, D, device=DEVICE, requires_grad=True) for _ in range(3))
    up = torch.randn(B, H, T, D, device=DEVICE)
    builds = kept.stats["builds"]
    got = _call(parts, [q, k, v], q, k, v, up)
    assert kept.stats["builds"] == builds + 1
    x64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    parts64 = Parts(T5Bias(H).to(DEVICE).double(), None, Softmax(), window=W)
    parts64.bias.load_state_dict(parts.bias.state_dict())
    ref, _ = dense_attention(*x64, parts64)
    compare("frozen t5", got, [ref, *torch.autograd.grad(ref, x64, up.double())], ["out", "dq", "dk", "dv"], 1e-4)


def test_one_slot_per_bias_and_length_freed_with_the_bias():
    kept.clear()
    q = torch.randn(B, H, T, D, device=DEVICE)
    bias = KerpleLog(H).to(DEVICE)
    for _ in range(3):  # training: a new version every step replaces the slot
        fused._kept_bands(q, bias, bias.fused_grad_args())
        with torch.no_grad():
            bias.r1.add_(0.01)
    assert kept.size() == 1
    fused._kept_bands(q[:, :, :T - 1], bias, bias.fused_grad_args())  # another length: its own slot
    assert kept.size() == 2
    del bias
    gc.collect()
    assert kept.size() == 0


def test_bands_must_fit_the_call():
    q = torch.randn(B, H, T, D, device=DEVICE)
    bias = KerpleLog(H).to(DEVICE)
    with torch.no_grad():
        tab = bias.table(T, DEVICE)
        other = kept.Bands(bias.table(T + 1, DEVICE), T + 1, False)
    with pytest.raises(ValueError, match="bands must replace the table"):
        kernel.biased_attention(q, q, q, tab, bands=kept.Bands(tab, T, False))
    with pytest.raises(ValueError, match="bands must replace the table"):
        kernel.biased_attention(q, q, q, bands=other)
    with pytest.raises(ValueError, match="bands must replace the table"):  # fp32 inputs read an fp32 band
        kernel.biased_attention(q, q, q, bands=kept.Bands(tab, T, True))
