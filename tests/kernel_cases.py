"""Shared pieces of the kernel tests: inputs, the comparison against the references, tolerances.

LENX_KERNEL_ERRORS=path appends every measured error as a JSON line (the device runs keep them)."""

import contextlib
import json
import os

import torch

from helpers import rel_err

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
ERR_LOG = os.environ.get("LENX_KERNEL_ERRORS")
GPU_T = [1, 17, 128, 1000, 4096]


def leaf(*shape, dtype):
    return torch.randn(*shape, device=DEVICE).to(dtype).requires_grad_()


def fp32_copy(x):
    return x.detach().float().requires_grad_()


def bias_table(kind, H, T):
    """A leaf [H, 2T - 1] table with a bias module's values (ALiBi's and Kerple's included), so the
    table gradient itself is compared."""
    from lenx.attention import ALiBi, KerpleLog, KerplePower, T5Bias

    if kind is None:
        return None
    torch.manual_seed(1)
    biases = {"kerple": KerpleLog, "kerple-power": KerplePower, "alibi": ALiBi, "t5": T5Bias}
    return biases[kind](H).to(DEVICE).table(T, DEVICE).detach().float().requires_grad_()


def dape_v2_case(T, H, d, D, ks, kind, dtype=torch.float64, device="cpu", seed=0):
    """One sequence of a Gluon DAPE V2 forward's inputs: q, k, v [1, H, T, d] in dtype, the conv
    weights (conv1 over 2H channels where a bias table `kind` comes, else H) in float64 for float64
    inputs, else float32, and the table (bias_table) likewise."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, T, d, generator=g).to(device, dtype) for _ in range(3))
    wt = torch.float64 if dtype == torch.float64 else torch.float32
    tab = bias_table(kind, H, T)
    tab = None if tab is None else tab.detach().to(device, wt)
    Cin = 2 * H if tab is not None else H
    w = [torch.randn(D, Cin, 1, ks, generator=g) * 0.3, torch.randn(D, generator=g) * 0.1,
         torch.randn(H, D, 1, ks, generator=g) * 0.3, torch.randn(H, generator=g) * 0.1]
    return q, k, v, [x.to(device, wt) for x in w], tab


def dape_v2_reference_rows(q, k, v, w, tab, rows):
    """The dense DAPE V2 reference's output at some query rows only (the convs run along keys, so
    rows are independent): what 8192 allows without T x T x D maps."""
    import math

    from lenx.ops.biased_softmax.reference import table_bias
    from lenx.ops.dape_v2.reference import dape_v2_scores

    pos = torch.arange(q.shape[-2], device=q.device)
    S = q[:, :, rows] @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    A = dape_v2_scores(S, None if tab is None else table_bias(tab, rows, pos), *w, rows, pos)
    return torch.softmax(A.masked_fill(pos[None, :] > rows[:, None], float("-inf")), -1) @ v


def log_errors(record: dict):
    if ERR_LOG:
        with open(ERR_LOG, "a") as f:
            f.write(json.dumps(record) + "\n")


def compare(what, outs, refs, names, tol, floors=None):
    """rel_err of each output/gradient; floors[name] replaces |ref| when the exact value is ~0
    (e.g. the conv2 bias gradient: a softmax ignores a per-row constant)."""
    floors = floors or {}
    errs = {}
    for name, a, b in zip(names, outs, refs):
        assert a is not None and b is not None, f"{what}: missing {name}"
        assert a.shape == b.shape, (what, name, a.shape, b.shape)
        assert torch.isfinite(a).all(), f"{what}: {name} has non-finite values (unwritten output?)"
        errs[name] = rel_err(a, b, floor=floors.get(name, 1e-6))
    log_errors({"case": what, "tol": tol, "errors": errs})
    tols = tol if isinstance(tol, dict) else {k: tol for k in errs}
    bad = {k: f"{e:.2e} >= {tols[k]:.1e}" for k, e in errs.items() if not e < tols[k]}
    assert not bad, f"{what}: relative errors over tolerance: {bad}"


def one_key_floors(names, dv):
    """T = 1: the output is v whatever the scores, so every gradient but dv is exactly 0; measure
    those against dv's size."""
    return {n: dv.norm().item() for n in names if n not in ("out", "dv")}


def tolerance(dtype):
    return 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4


def batch_for(T):
    return 1 if T >= 4096 else 2


def causal_gap(fn, T, t, d=16):
    """How much outputs at positions <= t move when inputs after t change (0 for a causal op)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, T, d, device=DEVICE) for _ in range(3))
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, t + 1:] = torch.randn_like(x[:, :, t + 1:])
    with torch.no_grad():
        a, b = fn(q, k, v), fn(q2, k2, v2)
    return max(float((x[:, :, : t + 1] - y[:, :, : t + 1]).abs().max()) for x, y in zip(a, b))


@contextlib.contextmanager
def bounds_checked():
    """Under Triton's interpreter: every load and store a kernel makes (its unmasked lanes) must
    fall inside one of the tensors passed to it. The interpreter itself reads and writes raw
    pointers, so a lane past a tensor's end goes unnoticed (a read) or corrupts the heap (a write)."""
    import numpy as np
    import triton.runtime.interpreter as interp

    ranges = []
    init, load, store = (interp.GridExecutor._init_args_hst, interp.InterpreterBuilder.create_masked_load,
                         interp.InterpreterBuilder.create_masked_store)

    def record(self, args, kwargs):
        out = init(self, args, kwargs)
        ranges[:] = [(st.data_ptr(), st.data_ptr() + st.nbytes())
                     for st in (a.untyped_storage() for a in [*args, *kwargs.values()] if hasattr(a, "untyped_storage"))]
        return out

    def check(ptrs, mask, what):
        addr = ptrs.data[mask.data.astype(bool)]
        size = np.dtype(interp._get_np_dtype(ptrs.get_element_ty())).itemsize
        inside = np.zeros(addr.shape, bool)
        for lo, hi in ranges:
            inside |= (addr >= lo) & (addr + size <= hi)
        assert inside.all(), f"{what} of {int((~inside).sum())} lanes outside every argument tensor"

    def checked_load(self, ptrs, mask, other, *rest):
        check(ptrs, mask, "load")
        return load(self, ptrs, mask, other, *rest)

    def checked_store(self, ptrs, value, mask, *rest):
        check(ptrs, mask, "store")
        return store(self, ptrs, value, mask, *rest)

    interp.GridExecutor._init_args_hst = record
    interp.InterpreterBuilder.create_masked_load = checked_load
    interp.InterpreterBuilder.create_masked_store = checked_store
    try:
        yield
    finally:
        interp.GridExecutor._init_args_hst = init
        interp.InterpreterBuilder.create_masked_load = load
        interp.InterpreterBuilder.create_masked_store = store


@contextlib.contextmanager
def reads_written():
    """Under Triton's interpreter: every lane a kernel loads from a tracked tensor must have been stored
    by some kernel since the tensor was tracked (a load of an element no kernel wrote fails; a store
    into an element marks it). Yields track(x) -> x, which tracks x (and keeps it alive, so that its
    memory is not another tensor's later)."""
    import numpy as np
    import triton.runtime.interpreter as interp

    tracked = []  # (first byte, end byte, element size, written flags, the tensor)
    load, store = interp.InterpreterBuilder.create_masked_load, interp.InterpreterBuilder.create_masked_store

    def track(x):
        assert x.is_contiguous()
        tracked.append((x.data_ptr(), x.data_ptr() + x.nbytes, x.element_size(), np.zeros(x.numel(), bool), x))
        return x

    def hits(ptrs, mask):
        addr = np.broadcast_to(ptrs.data, mask.data.shape)[mask.data.astype(bool)]
        for lo, hi, size, flags, _ in tracked:
            yield (addr[(addr >= lo) & (addr < hi)] - lo) // size, flags

    def checked_load(self, ptrs, mask, other, *rest):
        for idx, flags in hits(ptrs, mask):
            unwritten = int((~flags[idx]).sum())
            assert unwritten == 0, f"load of {unwritten} lanes that no kernel stored"
        return load(self, ptrs, mask, other, *rest)

    def checked_store(self, ptrs, value, mask, *rest):
        for idx, flags in hits(ptrs, mask):
            flags[idx] = True
        return store(self, ptrs, value, mask, *rest)

    interp.InterpreterBuilder.create_masked_load = checked_load
    interp.InterpreterBuilder.create_masked_store = checked_store
    try:
        yield track
    finally:
        interp.InterpreterBuilder.create_masked_load = load
        interp.InterpreterBuilder.create_masked_store = store
