"""The fused backend (lenx.attention.backends.fused) with module parts: it routes each composition to
its kernel and the parts' parameters get their gradients. Without CUDA under Triton's interpreter."""

import pytest
import torch

pytest.importorskip("triton")

from lenx.attention import Attention, AttentionConfig, DapeV2, KerpleLog, Softmax, StickBreaking  # noqa: E402
from lenx.attention.backends import Parts, dense_attention, run_backend  # noqa: E402
from kernel_cases import DEVICE, compare  # noqa: E402


@pytest.mark.parametrize("case", ["kerple", "dapev2-kerple", "stickbreaking"])
def test_routes_and_trains_part_params(case):
    """Kerple's r1, r2 get their gradients (from the kernel directly: the Kerple mode), and so do
    the DAPE V2 convs."""
    torch.manual_seed(0)
    B, H, T, d = 1, 2, 23, 16
    q, k, v = (torch.randn(B, H, T, d, device=DEVICE, requires_grad=True) for _ in range(3))
    bias = KerpleLog(H).to(DEVICE) if case != "stickbreaking" else None
    proc = DapeV2(H, 4, 3).to(DEVICE) if case.startswith("dapev2") else None
    norm = StickBreaking(H, d, remainder="drop") if case == "stickbreaking" else Softmax()
    parts = Parts(bias, proc, norm)
    params = [q, k, v] + (list(bias.parameters()) if bias is not None else []) + (list(proc.parameters()) if proc else [])
    out, rem = run_backend("triton", q, k, v, parts)
    outs = (out,) if rem is None else (out, rem)
    ups = tuple(torch.randn_like(x) for x in outs)
    grads = torch.autograd.grad(outs, params, ups)
    ref, ref_rem = dense_attention(q, k, v, parts)
    refs = (ref,) if rem is None else (ref, ref_rem)
    ref_grads = torch.autograd.grad(refs, params, ups)
    names = [f"out{i}" for i in range(len(outs))] + [f"g{i}" for i in range(len(params))]
    floors = {f"g{len(params) - 1}": ref_grads[-2].norm().item()} if proc else {}  # conv2 bias, see run_dape
    compare(f"fused backend {case}", [*outs, *grads], [*refs, *ref_grads], names, 1e-4, floors)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["kerple", "alibi", "t5", "dapev2-kerple", "dapev2-rope", "dapev2-alibi",
                                    "stickbreaking", "fox"])
@pytest.mark.parametrize("remainder", ["value", "head"])
def test_gpu_attention_module(method, remainder):
    """The whole attention module with backend='triton' against backend='dense' (fp32 weights and
    inputs: the kernels' exact-fp32 path), including RoPE and stick-breaking's remainder modes."""
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
            [names[i] for i in keep], fox_tolerances([names[i] for i in keep]), floors)


def fox_tolerances(names):
    """1e-4 for every output and gradient but the forget gate's bias: its gradient sums the tokens'
    d log f, terms of both signs (a reverse cumulative sum of dc) that cancel to about 1e-2 of their
    size, so the kernel's fp32 accumulation shows there at 1e-4-4e-4 relative (an H200, triton 3.6)."""
    return {n: 1e-3 if n.endswith("bias.proj.bias") else 1e-4 for n in names}


def test_dape_v2_forward_only_work_picks_gluon_only_where_it_can(monkeypatch):
    """The Gluon forward takes DAPE V2 only with nothing needing a gradient, a shape it covers, an sm_90
    GPU and triton 3.6 (else the Triton kernel: it has the backward), and never with
    LENX_DAPE_V2_GLUON=0."""
    from lenx.attention.backends import fused
    from lenx.ops.dape_v2 import gluon

    proc = DapeV2(12, 32, 3)
    q = torch.randn(1, 12, 8, 64).to(torch.bfloat16)
    monkeypatch.setattr(gluon, "unsupported_reason", lambda *a: None)  # as on an H100/H200 with triton 3.6
    monkeypatch.setenv("LENX_DAPE_V2_SKEWED", "0")
    assert fused._use_gluon(q, proc)
    assert fused._dape_v2_kernel(q, proc, grad=False) == "gluon"
    assert fused._dape_v2_kernel(q, proc, grad=True) == "triton"  # something needs a gradient
    assert fused._use_gluon(q, DapeV2(12, 32, 1))
    monkeypatch.setenv("LENX_DAPE_V2_GLUON", "0")
    assert not fused._use_gluon(q, proc)
    assert fused._dape_v2_kernel(q, proc, grad=False) == "triton"
    monkeypatch.undo()
    # on this machine (no sm_90 GPU, or another triton) the real check says why not
    reason = gluon.unsupported_reason(q, 12, 32, 3)
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        assert reason is not None and not fused._use_gluon(q, proc)


def test_forward_kernel_names_what_run_would_use(monkeypatch):
    """fused.forward_kernel (what `lenx bench` records as fwd_kernel) follows _use_gluon and
    _skewed_plan: "gluon" for DAPE V2 under no_grad where the Gluon forward runs, "skewed" with
    gradients, "triton" for compositions without a processor."""
    from lenx.attention.backends import fused
    from lenx.ops.dape_v2 import gluon

    monkeypatch.setattr(gluon, "unsupported_reason", lambda *a: None)  # as on an H100/H200 with triton 3.6
    q = torch.randn(1, 12, 8, 64).to(torch.bfloat16).requires_grad_()
    dape = Attention(AttentionConfig(method="dapev2-kerple"), 12, 768).parts
    kerple = Attention(AttentionConfig(method="kerple"), 12, 768).parts
    with torch.no_grad():
        assert fused.forward_kernel(q, q, q, dape) == "gluon"
        assert fused.forward_kernel(q, q, q, kerple) == "triton"
    assert fused.forward_kernel(q, q, q, dape) == "skewed"  # q and the conv weights need gradients
    monkeypatch.setenv("LENX_DAPE_V2_SKEWED", "0")
    assert fused.forward_kernel(q, q, q, dape) == "triton"


def test_parts_record_the_kernel_that_ran(monkeypatch, tmp_path):
    """The fused backend notes on the DAPE V2 processor which kernel it ran; training records the
    first step's in meta.json (and a resume's in its entry)."""
    import json

    from lenx.training.loop import record_kernels

    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter runs the kernels on CPU
    parts = Parts(KerpleLog(2).to(dev), DapeV2(2, 4, 3).to(dev), Softmax(), head_dim=16)
    q = torch.randn(1, 2, 9, 16, device=dev, requires_grad=True)
    assert parts.processor.kernel is None
    run_backend("triton", q, q, q, parts)
    assert parts.processor.kernel == "skewed (keep)"
    monkeypatch.setenv("LENX_DAPE_V2_SKEWED", "0")
    run_backend("triton", q, q, q, parts)
    assert parts.processor.kernel == "triton"
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"backends": ["triton"]}))
    record_kernels(tmp_path, [None])
    assert "kernels" not in json.loads(meta.read_text())
    record_kernels(tmp_path, ["skewed (keep)"])
    assert json.loads(meta.read_text())["kernels"] == ["skewed (keep)"]
    meta.write_text(json.dumps({"kernels": ["skewed (keep)"], "resumes": [{"step": 3}]}))
    record_kernels(tmp_path, ["skewed (recompute)"])
    saved = json.loads(meta.read_text())
    assert saved["kernels"] == ["skewed (keep)"] and saved["resumes"][0]["kernels"] == ["skewed (recompute)"]


def test_skewed_plan_follows_free_memory(monkeypatch):
    """Gradient work takes the skewed kernels with their buffers kept when six buffers fit in free
    memory, recomputed when four fit (in batch slices where only a slice's four do:
    test_skewed_memory), else the O(T)-memory Triton kernel; forward-only work only at a head dim
    the Triton kernel cannot take (wide), when three fit."""
    from lenx.attention.backends import fused
    from lenx.ops.dape_v2.skewed import buffer_bytes

    q = torch.randn(2, 12, 64, 64).to(torch.bfloat16)
    need = buffer_bytes(2, 12, 64, torch.bfloat16)
    hidden = buffer_bytes(2, 12, 64, torch.bfloat16, channels=32)
    q_cuda = type("FakeCuda", (), {"shape": q.shape, "dtype": q.dtype, "device": torch.device("cuda")})()

    def plan(free, grad, wide=False, D=32):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (free - 1000, 10 * free))
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev: 3000)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev: 2000)
        return fused._skewed_plan(q_cuda, D, grad, wide)

    for free, want in ((6 * need + hidden, "keep"), (6 * need + hidden - 1, "recompute"),
                       (4 * need + hidden, "recompute"), (4 * need + hidden - 1, "recompute, batch slices of 1"),
                       ((4 * need + hidden) // 2, "recompute, batch slices of 1"),
                       ((4 * need + hidden) // 2 - 1, None)):
        assert plan(free, True) == want, free
        assert plan(free, False) is None  # forward only: the Gluon or Triton forward
    assert plan(2 * need + hidden, False, wide=True) == "forward"
    assert plan(2 * need + hidden - 1, False, wide=True) is None
    # the hidden buffer is allocated with at least 16 channels (pow2(D, 16)): D 8 counts 16, not 8
    small = buffer_bytes(2, 12, 64, torch.bfloat16, channels=16)
    assert plan((4 * need + small) // 2 - 1, True, D=8) is None
    for mode in ("keep", "recompute"):
        monkeypatch.setenv("LENX_DAPE_V2_SKEWED", mode)
        assert plan(0, True) == mode
    monkeypatch.setenv("LENX_DAPE_V2_SKEWED", "0")
    assert plan(10 * need, True) is None and plan(10 * need, False, wide=True) is None


@pytest.mark.gpu
def test_gpu_125m_training_matches_the_chunked_path():
    """50 steps of the 125m model (DAPE V2-Kerple, bf16 autocast) on the skewed kernels against the
    chunked reference path: the loss curves agree within the bf16 noise, measured as the chunked
    path's own distance to an fp32 run of it."""
    from dataclasses import replace

    from lenx.attention.backends import fused
    from lenx.config import load_config
    from lenx.model import LM

    cfg = load_config("125m", [])
    B, T, V, steps = 4, 256, 512, 50
    gen = torch.Generator().manual_seed(0)
    base = torch.randint(0, V, (steps, B, T // 2 + 1), generator=gen)
    data = base.repeat_interleave(2, dim=-1)[..., : T + 1].to(DEVICE)  # each token repeats once: learnable

    def curve(backend, precision):
        torch.manual_seed(0)
        model = LM(replace(cfg.model, method="dapev2-kerple", backend=backend, vocab_size=V)).to(DEVICE)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
        losses = []
        for step in range(steps):
            x, y = data[step, :, :-1], data[step, :, 1:]
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
                _, loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        return torch.tensor(losses), model

    skewed, model = curve("triton", "bf16")
    q = torch.zeros(B, 12, T, 64, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    assert fused.forward_kernel(q, q, q, model.blocks[0].attn.parts) == "skewed"
    chunked, _ = curve("chunked", "bf16")
    exact, _ = curve("chunked", "fp32")
    noise = (chunked - exact).abs().max().item()
    gap = (skewed - chunked).abs().max().item()
    assert skewed[-1] < skewed[0] - 1.0, skewed  # it learns
    assert gap <= 2 * noise + 0.02, f"loss curves differ by {gap:.4f} (bf16 noise {noise:.4f})"


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["dapev2-kerple", "dape-alibi"])
def test_gpu_attention_module_eval_uses_gluon(method, monkeypatch):
    """Under no_grad in bf16 on sm_90 the module's forward runs the Gluon kernel (the Triton kernel is
    not called) and matches the dense backend."""
    from lenx.ops.dape_v2 import gluon

    if gluon.unsupported_reason(torch.zeros(1, 12, 1, 64, device=DEVICE, dtype=torch.bfloat16), 12, 32, 3):
        pytest.skip("the Gluon forward does not run here")
    import lenx.ops.dape_v2.triton as triton_op

    monkeypatch.setattr(triton_op, "dape_v2_triton", lambda *a, **k: pytest.fail("the Triton kernel ran"))
    torch.manual_seed(0)
    cfg = AttentionConfig(method=method, backend="dense")
    ref = Attention(cfg, 12, 768).to(DEVICE)
    fast = Attention(AttentionConfig(**{**cfg.__dict__, "backend": "triton"}), 12, 768).to(DEVICE)
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(2, 300, 768, device=DEVICE)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        y, y_ref = fast(x), ref(x)
    err = ((y.float() - y_ref.float()).norm() / y_ref.float().norm()).item()
    assert err < 2e-2, f"{method}: rel err {err:.3g}"


def fox_models(device, move=True, **shape):
    """Two fp32 `fox` LMs with the same weights (moved off their initial values unless not `move`),
    on the chunked reference and on the fused kernel."""
    from lenx.config import LMConfig
    from lenx.model import LM

    torch.manual_seed(0)
    models = [LM(LMConfig(method="fox", backend=b, **shape)).to(device) for b in ("chunked", "triton")]
    with torch.no_grad():
        for p in models[0].parameters() if move else []:
            p.add_(0.1 * torch.randn_like(p))
    models[1].load_state_dict(models[0].state_dict())
    return models


def fox_loss_and_grads(models, idx):
    out = []
    for model in models:
        _, loss = model(idx[:, :-1], idx[:, 1:])
        out.append([loss, *torch.autograd.grad(loss, list(model.parameters()))])
    return out


def test_fox_model_on_the_fused_kernel_equals_chunked(monkeypatch):
    """A `fox` model's loss and every gradient (the forget gates' through the kernel's dc) on backend
    triton equal those on chunked; under the interpreter the planner is told the device is CUDA."""
    from lenx.attention.backends.fused import Fused
    from lenx.ops.forgetting import triton as fox_kernel

    judge = Fused.unsupported
    monkeypatch.setattr(Fused, "unsupported", lambda self, parts, device: judge(self, parts, torch.device("cuda")))
    calls = []
    kernel = fox_kernel.forgetting_attention
    monkeypatch.setattr(fox_kernel, "forgetting_attention", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    models = fox_models(DEVICE, vocab_size=64, n_layer=2, n_head=2, d_model=32, chunk_size=16)
    idx = torch.randint(0, 64, (2, 42), device=DEVICE)
    (ref, *ref_grads), (got, *grads) = fox_loss_and_grads(models, idx)
    assert len(calls) == 2  # both layers ran the kernel
    names = ["loss"] + [n for n, _ in models[0].named_parameters()]
    compare("fox model triton vs chunked", [got, *grads], [ref, *ref_grads], names, 1e-4)
    gate = names.index("blocks.0.attn.bias.proj.weight") - 1
    assert ref_grads[gate].norm() > 0  # the gates do get a gradient (through the kernel's dc)


@pytest.mark.gpu
def test_gpu_fox_model_on_the_fused_kernel_equals_chunked():
    """The same at T 1000 with the model's own initialisation (f near 0.5: c near -0.7 t), fp32."""
    models = fox_models(DEVICE, move=False, vocab_size=256, n_layer=2, n_head=4, d_model=256)
    idx = torch.randint(0, 256, (2, 1001), device=DEVICE)
    (ref, *ref_grads), (got, *grads) = fox_loss_and_grads(models, idx)
    names = ["loss"] + [n for n, _ in models[0].named_parameters()]
    compare("gpu fox model triton vs chunked", [got, *grads], [ref, *ref_grads], names, fox_tolerances(names))
