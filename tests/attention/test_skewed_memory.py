"""DAPE V2's skewed training kernels under a memory budget (attention.backends.skewed_memory and
fused._skewed_plan): which layers keep their buffers, which recompute and in what batch slices,
and that the sliced path computes what the whole batch does. Without CUDA under Triton's
interpreter."""

import os
from pathlib import Path
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from lenx.attention import DapeV2, KerpleLog, Softmax  # noqa: E402
from lenx.attention.backends import Parts, run_backend  # noqa: E402
from lenx.attention.backends import fused, skewed_memory  # noqa: E402
from lenx.attention.backends.skewed_memory import GIB, KeptBytes, budget_bytes, plan  # noqa: E402
from kernel_cases import DEVICE, compare  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"


def test_plan_keeps_recomputes_slices_or_gives_up():
    """keep where the kept buffers and the working set fit the room; else recompute in the largest
    batch slice whose share of the working set fits; else nothing. The room is the free memory,
    and with a budget also the budget less what earlier layers keep."""
    keep, work = 200, 400  # whole batch of 4: a slice of b takes work * b / 4
    assert plan(4, keep, work, kept=0, free=600, budget=None) == ("keep", 4)
    assert plan(4, keep, work, kept=0, free=599, budget=None) == ("recompute", 4)
    assert plan(4, keep, work, kept=0, free=399, budget=None) == ("recompute", 3)
    assert plan(4, keep, work, kept=0, free=200, budget=None) == ("recompute", 2)
    assert plan(4, keep, work, kept=0, free=100, budget=None) == ("recompute", 1)
    assert plan(4, keep, work, kept=0, free=99, budget=None) == (None, 0)
    # auto ignores what is kept: the free memory already excludes it
    assert plan(4, keep, work, kept=10 ** 9, free=600, budget=None) == ("keep", 4)
    # a budget: less what is kept, and never more than the device has free
    assert plan(4, keep, work, kept=0, free=10 ** 9, budget=600) == ("keep", 4)
    assert plan(4, keep, work, kept=200, free=10 ** 9, budget=600) == ("recompute", 4)
    assert plan(4, keep, work, kept=400, free=10 ** 9, budget=600) == ("recompute", 2)
    assert plan(4, keep, work, kept=0, free=300, budget=600) == ("recompute", 3)
    assert plan(4, keep, work, kept=600, free=10 ** 9, budget=600) == (None, 0)
    assert plan(1, keep, work, kept=0, free=10 ** 9, budget=0) == (None, 0)


@pytest.mark.parametrize("value, want", [(None, None), ("auto", None), ("", None), ("0", 0), ("2", 2 * GIB),
                                         ("0.5", GIB // 2), (" 1.25 ", int(1.25 * GIB))])
def test_budget_reads_gib(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv(skewed_memory.BUDGET_ENV, raising=False)
    else:
        monkeypatch.setenv(skewed_memory.BUDGET_ENV, value)
    assert budget_bytes() == want


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "2GiB"])
def test_budget_refuses_what_is_not_gib(monkeypatch, value):
    monkeypatch.setenv(skewed_memory.BUDGET_ENV, value)
    with pytest.raises(ValueError, match="LENX_DAPE_V2_MEMORY must be 'auto' or a number of GiB") as err:
        budget_bytes()
    assert "\n" not in str(err.value)


def test_kept_bytes_count_until_the_backward_or_the_graph_goes():
    """A node's bytes count from add() until its backward has run, or until the node is freed
    without one; once either way."""
    class Double(torch.autograd.Function):  # a custom Function's node, as skewed.DapeV2Skewed's
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    kept = KeptBytes()
    x = torch.ones(3, requires_grad=True)
    y = Double.apply(x)
    kept.add(y.grad_fn, 100)
    z = Double.apply(x)
    kept.add(z.grad_fn, 10)
    assert kept.total == 110
    loss = y.sum()
    loss.backward()  # y's node ran; the graph still lives through `loss`
    assert kept.total == 10
    del loss, y
    assert kept.total == 10
    del z  # z's graph freed without a backward
    assert kept.total == 0


def fake_cuda(monkeypatch, q, free):
    """q's shape on a 'cuda' device whose free memory is `free` (the planner asks torch.cuda)."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (free, 10 * free))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev: 0)
    return type("FakeCuda", (), {"shape": q.shape, "dtype": q.dtype, "device": torch.device("cuda")})()


def test_skewed_plan_names_the_batch_slices(monkeypatch):
    """With a budget, the plan keeps, recomputes, or recomputes in batch slices ("recompute, batch
    slices of N", which _batch_slice reads back), counting what earlier layers keep; auto slices
    only where the whole batch's working set exceeds the free memory."""
    from lenx.ops.dape_v2.skewed import buffer_bytes

    q = torch.randn(4, 12, 64, 64).to(torch.bfloat16)
    need, hid = buffer_bytes(4, 12, 64, q.dtype), buffer_bytes(4, 12, 64, q.dtype, channels=32)
    work = 4 * need + hid
    qc = fake_cuda(monkeypatch, q, free=10 ** 12)
    monkeypatch.setattr(skewed_memory, "KEPT", KeptBytes())
    monkeypatch.setenv(skewed_memory.BUDGET_ENV, str((2 * need + work) / GIB))
    assert fused._skewed_plan(qc, 32, grad=True, forward=False) == "keep"
    skewed_memory.KEPT.total = 2 * need  # one layer keeps: the next has the working set's room only
    assert fused._skewed_plan(qc, 32, grad=True, forward=False) == "recompute"
    skewed_memory.KEPT.total = 2 * need + work // 2
    kernel = fused._skewed_plan(qc, 32, grad=True, forward=False)
    assert kernel == "recompute, batch slices of 2" and fused._batch_slice(f"skewed ({kernel})", 4) == 2
    assert fused._batch_slice("skewed (keep)", 4) == 4
    skewed_memory.KEPT.total = 2 * need + work
    assert fused._skewed_plan(qc, 32, grad=True, forward=False) is None  # the O(T)-memory kernel
    # forward-only work has no budget: it keeps nothing
    assert fused._skewed_plan(qc, 32, grad=False, forward=True) == "forward"
    monkeypatch.delenv(skewed_memory.BUDGET_ENV)
    qc = fake_cuda(monkeypatch, q, free=work // 4)  # auto: only a slice of 1 fits the device
    assert fused._skewed_plan(qc, 32, grad=True, forward=False) == "recompute, batch slices of 1"


def test_settings_that_name_nothing_are_one_line_errors(monkeypatch):
    for name, value in (("LENX_DAPE_V2_SKEWED", "yes"), ("LENX_DAPE_V2_GLUON", "2"), ("LENX_DAPE_V2_MEMORY", "x")):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=name):
            fused.check_settings()
        monkeypatch.delenv(name)
    fused.check_settings()


@pytest.mark.parametrize("name, value", [("LENX_DAPE_V2_MEMORY", "lots"), ("LENX_DAPE_V2_SKEWED", "always")])
def test_cli_refuses_a_bad_setting_before_any_work(tmp_path, name, value):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), name: value}
    out = subprocess.run([sys.executable, "-m", "lenx", "train", "-c", "small", "-o", "run"], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, env=env)
    assert out.returncode == 2 and out.stderr.startswith("error: ") and name in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


def test_sliced_recompute_computes_what_the_whole_batch_does(monkeypatch):
    """A budget that leaves room for one batch entry's working set only: the layer recomputes in
    slices of 1, and its output and every gradient match the whole batch's kept path; the budget's
    kept count is back to 0 after the backward."""
    torch.manual_seed(0)
    B, H, T, d = 3, 2, 11, 16
    q, k, v = (torch.randn(B, H, T, d, device=DEVICE, requires_grad=True) for _ in range(3))
    parts = Parts(KerpleLog(H).to(DEVICE), DapeV2(H, 4, 3).to(DEVICE), Softmax(), head_dim=d)
    params = [q, k, v, *parts.bias.parameters(), *parts.processor.parameters()]
    up = torch.randn(B, H, T, d, device=DEVICE)
    monkeypatch.setattr(skewed_memory, "KEPT", KeptBytes())

    def run(budget_gib):
        if budget_gib is None:
            monkeypatch.delenv(skewed_memory.BUDGET_ENV, raising=False)
        else:
            monkeypatch.setenv(skewed_memory.BUDGET_ENV, repr(budget_gib))
        out, _ = run_backend("triton", q, k, v, parts)
        kernel = parts.processor.kernel
        during = skewed_memory.KEPT.total
        return out, torch.autograd.grad(out, params, up), kernel, during

    whole, whole_grads, kernel, during = run(None)
    assert kernel == "skewed (keep)" and during > 0
    assert skewed_memory.KEPT.total == 0
    qc = fake_cuda(monkeypatch, q.detach(), free=0)
    need, hid = fused._buffers(qc, 4)
    one = (4 * need + hid) // B
    monkeypatch.undo()
    monkeypatch.setattr(skewed_memory, "KEPT", KeptBytes())
    sliced, sliced_grads, kernel, during = run(1.5 * one / GIB)
    assert kernel == "skewed (recompute, batch slices of 1)" and during == 0
    names = ["out"] + [f"g{i}" for i in range(len(params))]
    # conv2's bias moves every logit of a head alike: its gradient is rounding noise, measured
    # against the scale of conv2's weight gradient (as test_fused_backend does)
    floors = {names[-1]: whole_grads[-2].norm().item()}
    compare("sliced recompute", [sliced, *sliced_grads], [whole, *whole_grads], names, 1e-5, floors)


@pytest.mark.gpu
def test_gpu_budget_bounds_the_layer_peak(monkeypatch):
    """On a GPU: a budget of one batch entry's working set runs the layer in slices of 1; its peak
    above the inputs stays within the budget (plus the O(T) tensors), well under the kept path's,
    and its output and gradients match the kept path's."""
    torch.manual_seed(0)
    B, H, T, d = 4, 12, 1024, 64
    dev = torch.device("cuda")
    q, k, v = (torch.randn(B, H, T, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    parts = Parts(KerpleLog(H).to(dev), DapeV2(H, 32, 3).to(dev), Softmax(), head_dim=d)
    params = [q, k, v, *parts.bias.parameters(), *parts.processor.parameters()]
    up = torch.randn(B, H, T, d, device=dev, dtype=torch.bfloat16)
    monkeypatch.setattr(skewed_memory, "KEPT", KeptBytes())
    need, hid = fused._buffers(q, 32)
    one = (4 * need + hid) // B

    def run(budget):
        if budget is None:
            monkeypatch.delenv(skewed_memory.BUDGET_ENV, raising=False)
        else:
            monkeypatch.setenv(skewed_memory.BUDGET_ENV, repr(budget / GIB))
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out, _ = run_backend("triton", q, k, v, parts)
        grads = torch.autograd.grad(out, params, up)
        torch.cuda.synchronize()
        return out, grads, parts.processor.kernel, torch.cuda.max_memory_allocated() - base

    kept, kept_grads, kernel, kept_peak = run(None)
    assert kernel == "skewed (keep)"
    sliced, sliced_grads, kernel, sliced_peak = run(1.2 * one)
    assert kernel == "skewed (recompute, batch slices of 1)"
    o_t = 16 * B * H * T * d * 2  # q, k, v, out, their gradients and the kernels' O(T) operands, generously
    assert sliced_peak <= 1.2 * one + o_t, (sliced_peak, one)
    assert sliced_peak < kept_peak / 2, (sliced_peak, kept_peak)
    names = ["out"] + [f"g{i}" for i in range(len(params))]
    floors = {names[-1]: kept_grads[-2].float().norm().item()}
    compare("sliced recompute on the GPU", [sliced, *sliced_grads], [kept, *kept_grads], names, 1e-2, floors)
