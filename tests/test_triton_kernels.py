"""The fused Triton kernels against the dense fp32 references: the output and every gradient.

With CUDA the compiled kernels run; the tests marked gpu add long sequences (T up to 4096) in bf16.
Without CUDA the same kernels run under Triton's interpreter (TRITON_INTERPRET=1) on small sizes,
so CI checks their logic on CPU. The module is skipped when triton is not installed.

Every kernel output that the wrappers would allocate with torch.empty starts as NaN here (the
POISON switch), so an element a kernel forgets to write fails the comparison.
"""

import json
import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    # The interpreter is chosen when a kernel is decorated, i.e. when its module is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from helpers import rel_err  # noqa: E402
from lenx.attention import ALiBi, DapeV2, KerpleLog, KerplePower, Softmax, StickBreaking, T5Bias  # noqa: E402
from lenx.attention.backends import Parts, dense_attention  # noqa: E402
from lenx.ops import triton_attention  # noqa: E402
from lenx.ops.dape_v2 import biased as biased_mod  # noqa: E402
from lenx.ops.dape_v2 import triton as dape_mod  # noqa: E402
from lenx.ops.stickbreaking import triton as sb_mod  # noqa: E402
from lenx.ops.stickbreaking.reference import stickbreaking_reference  # noqa: E402

DEVICE = torch.device("cuda" if CUDA else "cpu")
BIASES = {"kerple": KerpleLog, "kerple-power": KerplePower, "alibi": ALiBi, "t5": T5Bias}
ERR_LOG = os.environ.get("LENX_KERNEL_ERRORS")  # a path: append every measured error as JSON lines


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setattr(biased_mod, "POISON", True)
    monkeypatch.setattr(sb_mod, "POISON", True)


@pytest.fixture(autouse=True)
def exact_reference():
    """The references must be fp32: cuDNN convolutions default to TF32 on Ampere+ GPUs, which
    once made the dense DAPE V2 reference itself off by ~1e-3."""
    if not CUDA:
        yield
        return
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def leaf(*shape, dtype):
    return torch.randn(*shape, device=DEVICE).to(dtype).requires_grad_()


def fp32_copy(x):
    return x.detach().float().requires_grad_()


def bias_table(kind, H, T):
    """A leaf [H, 2T - 1] table with a bias module's values (ALiBi's and Kerple's included), so the
    table gradient itself is compared."""
    if kind is None:
        return None
    torch.manual_seed(1)
    return BIASES[kind](H).to(DEVICE).table(T, DEVICE).detach().float().requires_grad_()


def table_bias(tab, T):
    """The dense reference's bias part reading the same table."""

    def bias(q_pos, k_pos, q=None, k=None):
        return tab[:, q_pos[:, None] - k_pos[None, :] + T - 1]

    return bias


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
    if ERR_LOG:
        with open(ERR_LOG, "a") as f:
            f.write(json.dumps({"case": what, "tol": tol, "errors": errs}) + "\n")
    tols = tol if isinstance(tol, dict) else {k: tol for k in errs}
    bad = {k: f"{e:.2e} >= {tols[k]:.1e}" for k, e in errs.items() if not e < tols[k]}
    assert not bad, f"{what}: relative errors over tolerance: {bad}"


def one_key_floors(names, dv):
    """T = 1: the output is v whatever the scores, so every gradient but dv is exactly 0; measure
    those against dv's size."""
    return {n: dv.norm().item() for n in names if n not in ("out", "dv")}


def tolerance(dtype):
    return 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4


# ---------------------------------------------------------------------------------------------
# cases, shared by the interpreter-sized tests and the gpu tests


def run_biased(B, H, T, d, kind, dtype, tol=None):
    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    tab = bias_table(kind, H, T)
    do = torch.randn(B, H, T, d, device=DEVICE)
    leaves = [q, k, v] + ([tab] if tab is not None else [])
    out = biased_mod.biased_attention(q, k, v, tab)
    grads = torch.autograd.grad(out, leaves, do.to(dtype))
    refs = [fp32_copy(x) for x in (q, k, v)] + leaves[3:]
    parts = Parts(None, table_bias(tab, T) if tab is not None else None, None, Softmax())
    ref, _ = dense_attention(*refs[:3], parts)
    ref_grads = torch.autograd.grad(ref, refs, do)
    names = ["out", "dq", "dk", "dv", "dtable"][: 1 + len(leaves)]
    floors = one_key_floors(names, ref_grads[2]) if T == 1 else {}
    compare(f"biased B{B} H{H} T{T} d{d} {kind} {dtype}", [out, *grads], [ref, *ref_grads], names,
            tol or tolerance(dtype), floors)


def run_biased_kerple_params(B, H, T, d, dtype, kind="log"):
    """The Kerple mode: the bias's two parameters get their gradients from the kernel directly (no
    table gradient); one head's first parameter sits below its clamp, so its gradient must be
    exactly zero."""
    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    bias = (KerpleLog if kind == "log" else KerplePower)(H).to(DEVICE)
    params = [bias.r1, bias.r2] if kind == "log" else [bias.a, bias.p]
    with torch.no_grad():
        params[0][0] = 1e-3
    do = torch.randn(B, H, T, d, device=DEVICE)
    out = biased_mod.biased_attention(q, k, v, bias.table(T, DEVICE), **bias.fused_grad_args())
    grads = torch.autograd.grad(out, [q, k, v] + params, do.to(dtype))
    refs = [fp32_copy(x) for x in (q, k, v)]
    ref, _ = dense_attention(*refs, Parts(None, bias, None, Softmax()))
    ref_grads = torch.autograd.grad(ref, refs + params, do)
    assert grads[3][0] == 0 and ref_grads[3][0] == 0
    names = ["out", "dq", "dk", "dv", "dx", "dy"]
    floors = one_key_floors(names, ref_grads[2]) if T == 1 else {}
    compare(f"biased kerple-{kind} params B{B} H{H} T{T} d{d} {dtype}", [out, *grads], [ref, *ref_grads], names,
            tolerance(dtype), floors)


def run_biased_t5_tail(B, H, T, d, dtype):
    """T5 with the constant-tail table gradient (key tiles beyond the last bucket's first distance
    add only their total): the embedding's gradient against the dense reference."""
    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    bias = T5Bias(H).to(DEVICE)
    with torch.no_grad():
        bias.relative_attention_bias.weight.normal_()
    do = torch.randn(B, H, T, d, device=DEVICE)
    params = [bias.relative_attention_bias.weight]
    out = biased_mod.biased_attention(q, k, v, bias.table(T, DEVICE), **bias.fused_grad_args())
    grads = torch.autograd.grad(out, [q, k, v] + params, do.to(dtype))
    refs = [fp32_copy(x) for x in (q, k, v)]
    ref, _ = dense_attention(*refs, Parts(None, bias, None, Softmax()))
    ref_grads = torch.autograd.grad(ref, refs + params, do)
    names = ["out", "dq", "dk", "dv", "dweight"]
    floors = one_key_floors(names, ref_grads[2]) if T == 1 else {}
    compare(f"biased t5 tail B{B} H{H} T{T} d{d} {dtype}", [out, *grads], [ref, *ref_grads], names,
            tolerance(dtype), floors)


def run_sb(B, H, T, d, attend_current, dtype, q_scale=1.0):
    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    if q_scale != 1.0:  # larger logits: the fp16 in-block scan rounds large softplus values
        q = (q.detach().float() * q_scale).to(dtype).requires_grad_()
    do = torch.randn(B, H, T, d, device=DEVICE)
    drem = torch.randn(B, H, T, device=DEVICE)
    out, rem = sb_mod.stickbreaking_triton(q, k, v, attend_current)
    assert out.dtype == dtype and rem.dtype == torch.float32
    grads = torch.autograd.grad((out, rem), (q, k, v), (do.to(dtype), drem))
    refs = [fp32_copy(x) for x in (q, k, v)]
    ref, ref_rem = stickbreaking_reference(*refs, attend_current)
    ref_grads = torch.autograd.grad((ref, ref_rem), refs, (do, drem))
    scaled = f" q x{q_scale:g}" if q_scale != 1.0 else ""
    compare(f"stickbreaking B{B} H{H} T{T} d{d} current={attend_current}{scaled} {dtype}", [out, rem, *grads],
            [ref, ref_rem, *ref_grads], ["out", "rem", "dq", "dk", "dv"], tolerance(dtype))


def run_dape(B, H, T, d, ks, D, kind, dtype, conv_precision="bf16"):
    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    tab = bias_table(kind, H, T)
    proc = DapeV2(H, D, ks, with_bias=tab is not None).to(DEVICE)
    params = list(proc.parameters())  # conv1.weight, conv1.bias, conv2.weight, conv2.bias
    do = torch.randn(B, H, T, d, device=DEVICE)
    extra = [tab] if tab is not None else []
    out = dape_mod.dape_v2_triton(q, k, v, proc, tab, conv_precision)
    grads = torch.autograd.grad(out, [q, k, v] + extra + params, do.to(dtype))
    refs = [fp32_copy(x) for x in (q, k, v)]
    parts = Parts(None, table_bias(tab, T) if tab is not None else None, proc, Softmax())
    ref, _ = dense_attention(*refs, parts)
    ref_grads = torch.autograd.grad(ref, refs + extra + params, do)
    names = ["out", "dq", "dk", "dv"] + (["dtable"] if extra else []) + ["dw1", "db1", "dw2", "db2"]
    # The conv2 bias adds a per-(row, head) constant, which the softmax ignores: its exact
    # gradient is 0, so its error is measured against the conv2 weight gradient's size.
    floors = {"db2": ref_grads[-2].norm().item()}
    if T == 1:
        floors = one_key_floors(names, ref_grads[2])
    tol = tolerance(dtype)
    if dtype != torch.float32:
        # conv1's weight and bias gradients are sums over all (i, j) pairs of terms that largely
        # cancel (each softmax row's gradient sums to zero), so any bf16 computation of them has a
        # relative error of several 1e-2. Hold the kernel to the same bar as eager PyTorch in
        # bf16 (the dense path under autocast): within 1.5x of its error, or 1e-2.
        with torch.autocast(DEVICE.type, dtype=dtype):
            base, _ = dense_attention(q, k, v, parts)
        base_grads = torch.autograd.grad(base, [q, k, v] + extra + params, do.to(dtype))
        base_errs = [rel_err(a, b, floors.get(n, 1e-6)) for n, a, b in zip(names, [base, *base_grads], [ref, *ref_grads])]
        tol = {n: max(tol, 1.5 * e) for n, e in zip(names, base_errs)}
        if ERR_LOG:
            with open(ERR_LOG, "a") as f:
                f.write(json.dumps({"case": f"bf16 eager baseline of {B} {H} {T} {d} {ks} {D} {kind}",
                                    "errors": dict(zip(names, base_errs))}) + "\n")
    what = f"dapev2 B{B} H{H} T{T} d{d} k{ks} D{D} {kind} {dtype} conv={conv_precision}"
    compare(what, [out, *grads], [ref, *ref_grads], names, tol, floors)


# ---------------------------------------------------------------------------------------------
# small sizes: the interpreter on CPU (and the compiled kernels on a GPU)


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


def test_biased_rejects_bad_kerple_and_tail():
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    tab = KerpleLog(2).to(DEVICE).table(8, DEVICE)
    r = torch.ones(2, device=DEVICE)
    with pytest.raises(ValueError, match="kerple must be"):
        biased_mod.biased_attention(q, q, q, tab, ("cubic", r, r))
    with pytest.raises(ValueError, match="kerple must be"):
        biased_mod.biased_attention(q, q, q, None, ("log", r, r))
    with pytest.raises(ValueError, match="tail must be"):
        biased_mod.biased_attention(q, q, q, None, tail=113)
    with pytest.raises(ValueError, match="tail must be"):
        biased_mod.biased_attention(q, q, q, tab, ("log", r, r), tail=113)


def test_biased_small_t5_alibi():
    run_biased(1, 3, 33, 32, "t5", torch.float32)
    run_biased(1, 2, 20, 16, "alibi", torch.float32)


@pytest.mark.parametrize("kind", ["kerple", "kerple-power", "alibi", "t5"])
def test_biased_small_fp16_band(monkeypatch, kind):
    """The bias band as fp16 residuals against per-row fp32 offsets (the bf16/fp16 default) on
    the exact fp32 path, with larger tiles (several key tiles per query tile, padding rows): the
    residuals' rounding is the only error (measured <= 4e-4), so 2e-3."""
    monkeypatch.setitem(biased_mod.CONFIG_FP32, "band", ("fp16",))
    monkeypatch.setitem(biased_mod.CONFIG_FP32, "fwd", (64, 32, 4, 1))
    monkeypatch.setitem(biased_mod.CONFIG_FP32, "dq", (64, 32, 4, 1))
    run_biased(1, 2, 130, 16, kind, torch.float32, tol=2e-3)


@pytest.mark.parametrize("T", [1, 17, 40])
@pytest.mark.parametrize("attend_current", [False, True])
def test_stickbreaking_small(T, attend_current):
    run_sb(2, 2, T, 16, attend_current, torch.float32)


def test_stickbreaking_small_cumsum_scan(monkeypatch):
    """The in-block prefix/suffix sums by tl.cumsum instead of tensor-core products."""
    monkeypatch.setitem(sb_mod.CONFIG_FP32, "scan", ("cumsum",))
    run_sb(1, 2, 70, 16, True, torch.float32)


@pytest.mark.parametrize("T,ks,kind", [(1, 3, "kerple"), (17, 1, None), (40, 3, "kerple"), (29, 5, "alibi"),
                                       (33, 7, None)])
def test_dape_small(T, ks, kind):
    run_dape(2, 2, T, 16, ks, 4, kind, torch.float32)


def test_dape_small_two_pass_dkdv(monkeypatch):
    """The dK/dV split into a dV pass and a dK pass (used for wide windows on the GPU)."""
    monkeypatch.setattr(dape_mod, "DKDV_ONE_PASS_MAX", 0)
    run_dape(1, 2, 40, 16, 3, 4, "t5", torch.float32)


def test_dape_small_wide_window_k3(monkeypatch):
    """k = 3 with 32-key windows (the bf16 default on the GPU; fp32 inputs use 16 otherwise)."""
    monkeypatch.setitem(dape_mod.TILES, "k3_big", (16, 32, 8, 1))
    run_dape(1, 2, 70, 16, 3, 4, "kerple", torch.float32)


def causal_gap(fn, T, t, d=16):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, T, d, device=DEVICE) for _ in range(3))
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, t + 1:] = torch.randn_like(x[:, :, t + 1:])
    with torch.no_grad():
        a, b = fn(q, k, v), fn(q2, k2, v2)
    return max(float((x[:, :, : t + 1] - y[:, :, : t + 1]).abs().max()) for x, y in zip(a, b))


@pytest.mark.parametrize("kernel", ["biased", "stickbreaking", "dapev2"])
def test_causal(kernel):
    T, t = (40, 17) if not CUDA else (300, 150)
    tab = bias_table("kerple", 2, T)
    proc = DapeV2(2, 4, 3, with_bias=True).to(DEVICE)
    fns = {
        "biased": lambda q, k, v: (biased_mod.biased_attention(q, k, v, tab),),
        "stickbreaking": lambda q, k, v: sb_mod.stickbreaking_triton(q, k, v),
        "dapev2": lambda q, k, v: (dape_mod.dape_v2_triton(q, k, v, proc, tab),),
    }
    assert causal_gap(fns[kernel], T, t) < 1e-6


@pytest.mark.parametrize("case", ["kerple", "dapev2-kerple", "stickbreaking"])
def test_triton_attention_routes_and_trains_bias_params(case):
    """lenx.ops.triton_attention with module parts: Kerple's r1, r2 get their gradients (from the kernel
    directly: the Kerple mode), and so do the DAPE V2 convs."""
    torch.manual_seed(0)
    B, H, T, d = 1, 2, 23, 16
    q, k, v = (torch.randn(B, H, T, d, device=DEVICE, requires_grad=True) for _ in range(3))
    bias = KerpleLog(H).to(DEVICE) if case != "stickbreaking" else None
    proc = DapeV2(H, 4, 3).to(DEVICE) if case.startswith("dapev2") else None
    norm = StickBreaking(H, d, remainder="drop") if case == "stickbreaking" else Softmax()
    parts = Parts(None, bias, proc, norm)
    params = [q, k, v] + (list(bias.parameters()) if bias is not None else []) + (list(proc.parameters()) if proc else [])
    out, rem = triton_attention(q, k, v, parts)
    outs = (out,) if rem is None else (out, rem)
    ups = tuple(torch.randn_like(x) for x in outs)
    grads = torch.autograd.grad(outs, params, ups)
    ref, ref_rem = dense_attention(q, k, v, parts)
    refs = (ref,) if rem is None else (ref, ref_rem)
    ref_grads = torch.autograd.grad(refs, params, ups)
    names = [f"out{i}" for i in range(len(outs))] + [f"g{i}" for i in range(len(params))]
    floors = {f"g{len(params) - 1}": ref_grads[-2].norm().item()} if proc else {}  # conv2 bias, see run_dape
    compare(f"triton_attention {case}", [*outs, *grads], [*refs, *ref_grads], names, 1e-4, floors)


# ---------------------------------------------------------------------------------------------
# long sequences in bf16 (and fp32 at small T): the compiled kernels on a GPU

GPU_T = [1, 17, 128, 1000, 4096]


def batch_for(T):
    return 1 if T >= 4096 else 2


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


@pytest.mark.gpu
@pytest.mark.parametrize("T", GPU_T)
@pytest.mark.parametrize("attend_current", [False, True])
def test_gpu_stickbreaking(T, attend_current):
    run_sb(batch_for(T), 12, T, 64, attend_current, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [32, 128])
def test_gpu_stickbreaking_head_dims(d):
    run_sb(2, 4, 1000, d, False, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("q_scale", [4.0, 8.0])
def test_gpu_stickbreaking_large_logits(q_scale):
    run_sb(1, 12, 2048, 64, False, torch.bfloat16, q_scale)


@pytest.mark.gpu
def test_gpu_stickbreaking_fp32():
    run_sb(2, 2, 300, 32, False, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("T", GPU_T)
def test_gpu_dape_kerple(T):
    """The paper's headline setting: H = 12, d = 64, k = 3, D = 32, Kerple."""
    run_dape(batch_for(T), 12, T, 64, 3, 32, "kerple", torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("T,H,d,ks,D,kind", [
    (1000, 4, 32, 5, 16, None),  # dapev2-rope / -nope: no bias channels
    (128, 2, 64, 7, 8, "alibi"),  # widest kernel: 32-key windows, split dK/dV passes
    (1000, 3, 32, 1, 8, "t5"),  # DAPE v1 (k = 1)
    (1000, 16, 64, 3, 64, "kerple"),  # the 350M model's heads, widest hidden
])
def test_gpu_dape_shapes(T, H, d, ks, D, kind):
    run_dape(2, H, T, d, ks, D, kind, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_dape_tf32_conv():
    run_dape(2, 12, 1000, 64, 3, 32, "kerple", torch.bfloat16, conv_precision="tf32")


@pytest.mark.gpu
def test_gpu_dape_fp32():
    run_dape(2, 2, 300, 32, 3, 4, "kerple", torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["kerple", "alibi", "t5", "dapev2-kerple", "dapev2-rope", "dapev2-alibi",
                                    "stickbreaking"])
@pytest.mark.parametrize("remainder", ["value", "head"])
def test_gpu_attention_module(method, remainder):
    """The whole attention module with backend='triton' against backend='dense' (fp32 weights and
    inputs: the kernels' exact-fp32 path), including RoPE and stick-breaking's remainder modes."""
    from lenx.attention import Attention, AttentionConfig

    if remainder == "head" and method != "stickbreaking":
        pytest.skip("remainder modes belong to stick-breaking")
    torch.manual_seed(0)
    cfg = AttentionConfig(method=method, backend="dense", sb_remainder=remainder)
    ref = Attention(cfg, 4, 128).to(DEVICE)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "rem_vector" in name:
                p.normal_(0, 0.5)
    fast = Attention(AttentionConfig(**{**cfg.__dict__, "backend": "triton"}), 4, 128).to(DEVICE)
    fast.load_state_dict(ref.state_dict())
    assert fast.backend_for(DEVICE) == "triton"
    x = torch.randn(2, 200, 128, device=DEVICE, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y_ref, y = ref(x), fast(x2)
    g = torch.randn_like(y)
    y_ref.backward(g)
    y.backward(g)
    outs = [y, x2.grad] + [p.grad for _, p in fast.named_parameters()]
    refs = [y_ref, x.grad] + [p.grad for _, p in ref.named_parameters()]
    names = ["out", "dx"] + [n for n, _ in fast.named_parameters()]
    floors = {n: 1.0 for n in names if n.endswith("conv2.bias")}
    keep = [i for i, r in enumerate(refs) if r is not None]
    compare(f"module {method} {remainder}", [outs[i] for i in keep], [refs[i] for i in keep],
            [names[i] for i in keep], 1e-4, floors)
