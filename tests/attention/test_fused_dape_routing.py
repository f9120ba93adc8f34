"""DAPE V2 in the fused backend: head dim 128 (which the O(T) Triton kernel cannot take: it pads
the heads to at least 16 slots, and 16 x 128 > 1024) goes to the skewed kernels, forward only included, else to the chunked reference; and
forward-only work reuses its host tables (ops.dape_v2.tables) until the weights change. Without
CUDA under Triton's interpreter."""

import pytest
import torch

pytest.importorskip("triton")

from lenx.attention import DapeV2, KerpleLog, Softmax  # noqa: E402
from lenx.attention.backends import Parts, Work, dense_attention, get_backend, run_backend  # noqa: E402
from lenx.attention.backends import fused  # noqa: E402
from lenx.ops.dape_v2 import gluon, skewed, tables  # noqa: E402
from kernel_cases import DEVICE, compare  # noqa: E402

H, D = 2, 4


def wide_parts(d=128):
    torch.manual_seed(0)
    return Parts(KerpleLog(H).to(DEVICE), DapeV2(H, D, 3).to(DEVICE), Softmax(), head_dim=d)


def qkv(T, d=128, grad=False):
    return [torch.randn(1, H, T, d, device=DEVICE, requires_grad=grad) for _ in range(3)]


def test_the_planner_takes_head_dim_128():
    parts = wide_parts()
    assert get_backend("triton").unsupported(parts, torch.device("cuda")) in (None, "triton is not installed")
    assert fused._wide(parts.processor, 128) and not fused._wide(parts.processor, 64)
    # where the skewed buffers do not fit it runs the chunked reference: the memory it declares is that one
    work = Work(batch=1, heads=H, length=4096, head_dim=128)
    assert fused.Fused().memory(parts, work) == get_backend("chunked").memory(parts, work)
    narrow = Work(batch=1, heads=H, length=4096, head_dim=64, itemsize=2)  # fp32 d 64 overflows it too
    assert fused.Fused().memory(parts, narrow) != get_backend("chunked").memory(parts, narrow)


def test_head_dim_128_trains_on_the_skewed_kernels():
    tables.clear()  # what earlier tests of this process cached is not this test's business
    parts = wide_parts()
    q, k, v = qkv(17, grad=True)
    params = [q, k, v, *parts.bias.parameters(), *parts.processor.parameters()]
    out, _ = run_backend("triton", q, k, v, parts)
    assert parts.processor.kernel == "skewed (keep)"
    up = torch.randn_like(out)
    ref, _ = dense_attention(q, k, v, parts)
    names = ["out"] + [f"g{i}" for i in range(len(params))]
    floors = {names[-1]: 1.0}  # conv2's bias: its exact gradient is 0 (see run_dape)
    compare("wide training", [out, *torch.autograd.grad(out, params, up)],
            [ref, *torch.autograd.grad(ref, params, up)], names, 1e-4, floors)
    assert tables.size() == 0  # training never fills the cache


def test_head_dim_128_forward_reuses_its_tables_until_a_step(monkeypatch):
    """Forward only: the skewed forward with the host tables built once; an optimizer step on the
    conv weights (or the bias's) rebuilds them, and the output follows the new weights."""
    tables.clear()
    built = []
    real = skewed.host_tables
    monkeypatch.setattr(skewed, "host_tables", lambda *a: built.append(1) or real(*a))
    parts = wide_parts()
    q, k, v = qkv(23)

    def check(what):
        with torch.no_grad():
            out, _ = run_backend("triton", q, k, v, parts)
            ref, _ = dense_attention(q, k, v, parts)
        assert parts.processor.kernel == "skewed (forward)"
        compare(what, [out], [ref], ["out"], 1e-4)

    check("first")
    check("cached")
    assert len(built) == 1
    for module in (parts.processor, parts.bias):
        params = list(module.parameters())
        for p in params:
            p.grad = torch.randn_like(p)
        torch.optim.SGD(params, lr=0.5).step()
        check(f"after a step of {type(module).__name__}")
    assert len(built) == 3


def test_head_dim_128_without_the_skewed_kernels_runs_the_chunked_reference(monkeypatch):
    monkeypatch.setenv("LENX_DAPE_V2_SKEWED", "0")
    parts = wide_parts()
    q, k, v = qkv(19, grad=True)
    out, _ = run_backend("triton", q, k, v, parts)
    assert parts.processor.kernel == "chunked"
    compare("chunked fallback", [out], [dense_attention(q, k, v, parts)[0]], ["out"], 1e-5)


def test_gluon_forward_gets_cached_operands(monkeypatch):
    """The Gluon path (faked here: it needs an sm_90 GPU): gluon.prepare runs once for repeated
    forward-only calls with the same weights, again after a bias parameter changes in place, and
    the kernel gets what it returned."""
    tables.clear()
    prepared, seen = [], []
    real = gluon.prepare
    monkeypatch.setattr(fused, "_use_gluon", lambda q, proc: True)
    monkeypatch.setattr(gluon, "prepare", lambda *a: prepared.append(real(*a)) or prepared[-1])
    monkeypatch.setattr(gluon, "dape_v2_gluon_forward",
                        lambda q, k, v, *w, prepared=None: seen.append(prepared) or (q, None))
    parts = wide_parts(64)
    q, k, v = qkv(12, d=64)
    with torch.no_grad():
        for _ in range(3):
            run_backend("triton", q, k, v, parts)
        parts.bias.r1.add_(0.1)
        run_backend("triton", q, k, v, parts)
    assert len(prepared) == 2
    assert all(s is prepared[0] for s in seen[:3]) and seen[3] is prepared[1]
    assert not torch.equal(prepared[0][4], prepared[1][4])  # t2 follows the bias


@pytest.mark.parametrize("pick,heads,ran", [(None, 2, "chain_ws"), ("ws", 2, "chain_ws"), ("1", 2, "chain_ws"),
                                             ("chain", 2, "chain"), ("gluon", 2, "gluon"), (None, 16, "gluon")])
def test_the_gluon_forward_runs_the_kernel_asked_for(pick, heads, ran, monkeypatch):
    """Which Gluon kernel forward-only work runs (the kernels faked: they need an sm_90 GPU): the
    warp-specialised chain by default, chain.py or gluon.py when LENX_DAPE_V2_GLUON says so, and
    gluon.py where the chains cannot take the shape (H > 12)."""
    from lenx.ops.dape_v2 import chain, chain_ws

    if pick is None:
        monkeypatch.delenv("LENX_DAPE_V2_GLUON", raising=False)
    else:
        monkeypatch.setenv("LENX_DAPE_V2_GLUON", pick)
    seen = []
    fake = lambda name: lambda q, k, v, *w, prepared=None, **kw: seen.append(name) or (q, None)  # noqa: E731
    monkeypatch.setattr(chain, "dape_v2_chain_forward", fake("chain"))
    monkeypatch.setattr(chain_ws, "dape_v2_chain_ws_forward", fake("chain_ws"))
    monkeypatch.setattr(gluon, "dape_v2_gluon_forward", fake("gluon"))
    monkeypatch.setattr(gluon, "unsupported_reason", lambda *a: None)
    proc = DapeV2(heads, D, 3).to(DEVICE)
    q, k, v = (torch.randn(1, heads, 8, 64, device=DEVICE) for _ in range(3))
    out = fused._gluon_forward(q, k, v, proc, proc.conv_weights(), prepared=None)
    assert seen == [ran] and out is q
    assert proc.kernel == {"chain_ws": "gluon (chain_ws)", "chain": "gluon (chain)"}.get(ran, proc.kernel)


def test_a_wrong_gluon_choice_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("LENX_DAPE_V2_GLUON", "fast")
    with pytest.raises(ValueError, match="LENX_DAPE_V2_GLUON must be one of ws, 1, chain, gluon, 0, got 'fast'"):
        fused._use_gluon(torch.zeros(1, H, 4, 64), DapeV2(H, D, 3))


@pytest.mark.gpu
@pytest.mark.parametrize("grad", [True, False])
def test_gpu_module_head_dim_128(grad):
    """The whole dapev2-kerple module at d 128 (12 heads of 128) with backend='triton' against
    'dense' (fp32: the kernels' exact path): training on the skewed kernels, forward only on the
    skewed forward."""
    from lenx.attention import Attention, AttentionConfig

    torch.manual_seed(0)
    cfg = AttentionConfig(method="dapev2-kerple", backend="dense")
    ref = Attention(cfg, 12, 1536).to(DEVICE)
    fast = Attention(AttentionConfig(**{**cfg.__dict__, "backend": "triton"}), 12, 1536).to(DEVICE)
    fast.load_state_dict(ref.state_dict())
    assert fast.backend_for(DEVICE) == "triton"
    x = torch.randn(2, 300, 1536, device=DEVICE, requires_grad=grad)
    x2 = x.detach().clone().requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        y_ref, y = ref(x), fast(x2)
    assert fast.processor.kernel == ("skewed (keep)" if grad else "skewed (forward)")
    if not grad:
        compare("module d128 forward", [y], [y_ref], ["out"], 1e-4)
        return
    g = torch.randn_like(y)
    y_ref.backward(g)
    y.backward(g)
    names = ["out", "dx"] + [n for n, _ in fast.named_parameters()]
    outs = [y, x2.grad] + [p.grad for _, p in fast.named_parameters()]
    refs = [y_ref, x.grad] + [p.grad for _, p in ref.named_parameters()]
    floors = {n: 1.0 for n in names if n.endswith("conv2.bias")}
    compare("module d128 training", outs, refs, names, 1e-4, floors)


def test_tables_out_of_the_gluon_range_route_forward_only_work_to_the_skewed_forward(monkeypatch):
    """The Gluon forward faked (it needs an sm_90 GPU): Kerple-power's tables at T 2048 (|t1| in the
    hundred thousands: fp16 overflows, the kernel returned NaN) send forward-only work to the skewed
    forward, with the reason in the processor's kernel_note; Kerple-log's at the same T stay on the
    Gluon forward. The routing needs only the shapes and the host tables (q is never read)."""
    from lenx.attention import KerplePower

    tables.clear()
    monkeypatch.setattr(fused, "_use_gluon", lambda q, proc: True)
    q = torch.zeros(1, H, 2048, 64, device=DEVICE)
    torch.manual_seed(0)
    with torch.no_grad():
        steep = KerplePower(H).to(DEVICE)
        steep.a.fill_(0.5), steep.p.fill_(1.9)  # -0.5 n^1.9: -1e6 at n 2047 (the initialisation draws p up to 2)
        power = Parts(steep, DapeV2(H, D, 3).to(DEVICE), Softmax(), head_dim=64)
        assert fused.forward_kernel(q, q, q, power) == "skewed"
        assert "fp16" in power.processor.kernel_note
        log = wide_parts(64)
        assert fused.forward_kernel(q, q, q, log) == "gluon" and log.processor.kernel_note is None


def test_tables_out_of_the_gluon_range_run_on_the_skewed_forward(monkeypatch):
    """run(): with the range bound at 0 every table is out of it; the work then runs the skewed
    forward (not the faked Gluon one) and matches the dense path."""
    tables.clear()
    monkeypatch.setattr(fused, "_use_gluon", lambda q, proc: True)
    monkeypatch.setattr(gluon, "FP16_SAFE", 0.0)
    monkeypatch.setattr(gluon, "dape_v2_gluon_forward", lambda *a, **kw: pytest.fail("ran the Gluon forward"))
    parts = wide_parts(64)
    q, k, v = qkv(13, d=64)
    with torch.no_grad():
        out, _ = run_backend("triton", q, k, v, parts)
        ref, _ = dense_attention(q, k, v, parts)
    assert parts.processor.kernel == "skewed (forward)" and parts.processor.kernel_note
    compare("off gluon", [out], [ref], ["out"], 1e-4)


def test_the_skewed_path_decides_the_residual_without_a_sync_after_the_first_call(monkeypatch):
    """Training: the backend keeps a ResidualSwitch per processor: the first call leaves the decision
    to the op (residual None: with a sync), the next ones pass the previous call's answer (Kerple-log:
    off)."""
    seen = []
    real = skewed.dape_v2_skewed
    monkeypatch.setattr(skewed, "dape_v2_skewed", lambda *a, **kw: seen.append(kw["residual"]) or real(*a, **kw))
    parts = wide_parts()
    for _ in range(2):
        q, k, v = (x.half().requires_grad_() for x in qkv(9))  # fp32 never needs the residual
        run_backend("triton", q, k, v, parts)
    assert seen == [None, False]
