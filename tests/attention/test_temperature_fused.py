"""A query temperature on the fused biased-softmax and FoX kernels: its factor rides on the kernels'
score scale (q_scale), so the separate scaling of q (temperature._scaled) never runs, and the layer
is the unfolded one (q scaled, then the same kernels) and the float64 dense reference, forward and
every gradient (s_h's too). On the CPU the kernels run under Triton's interpreter (the planner puts
the fused backend on CUDA only, so the layer is told to take it)."""

import pytest
import torch

from helpers import V, assert_close, model_for, rel_err

pytest.importorskip("triton")
from lenx.attention import Attention, AttentionConfig, temperature  # noqa: E402
from lenx.attention.backends import run_backend  # noqa: E402
from lenx.attention.backends.fused import Fused  # noqa: E402

SHORT = dict(temp_train_len=8, temp_floor_scale=4.0, temp_attn_scale=0.3)


class Calls:
    """Counts the separate scaling of q (both ways), SSMax's reduction over q for s_h (ssmax_grad)
    and the q_scale the fused backend receives."""

    def __init__(self, monkeypatch):
        self.scaled, self.reductions, self.factors = 0, 0, []
        scaled, reduction, run = temperature._scaled, temperature.ssmax_grad, Fused.run

        def spy_scaled(x, f):
            self.scaled += 1
            return scaled(x, f)

        def spy_reduction(y, s):
            self.reductions += 1
            return reduction(y, s)

        def spy_run(backend, *args, q_scale=None, **kwargs):
            self.factors.append(q_scale)
            return run(backend, *args, q_scale=q_scale, **kwargs)

        monkeypatch.setattr(temperature, "_scaled", spy_scaled)
        monkeypatch.setattr(temperature, "ssmax_grad", spy_reduction)
        monkeypatch.setattr(Fused, "run", spy_run)


def layers(method, device, dtype, n_head=3, d_model=48, window=0):
    """(the float64 dense reference, the layer on the fused backend) with the same weights; SSMax's
    s_h set apart per head."""
    torch.manual_seed(0)
    cfg = dict(method=method, window=window, **SHORT)
    ref = Attention(AttentionConfig(backend="dense", **cfg), n_head, d_model).double().to(device)
    with torch.no_grad():
        if ref.temperature is not None and ref.temperature.s is not None:
            ref.temperature.s.copy_(torch.linspace(0.43, 1.7, n_head))
    if dtype != torch.float32:  # the reference takes the rounded weights: only the computation differs
        ref.load_state_dict({name: p.to(dtype).double() for name, p in ref.state_dict().items()})
    fast = Attention(AttentionConfig(**cfg), n_head, d_model).to(device)
    fast.load_state_dict(ref.state_dict())
    fast.to(dtype)
    fast.backend_for = lambda device, segments=False: "triton"  # what the planner gives on CUDA
    return ref, fast


def forward_backward(layer, x, w, segments=None):
    x = x.detach().clone().requires_grad_()
    y = layer(x, segments=segments)
    grads = torch.autograd.grad((y * w.to(y)).sum(), [x] + list(layer.parameters()))
    return [y] + list(grads)


def run_fold(method, monkeypatch, device="cpu", dtype=torch.float32, n_head=3, d_model=48, T=61, window=0,
             docs=False, tol=1e-5, ref_tol=1e-4, bound=None):
    """bound (bf16): instead of tol and ref_tol, each output and gradient of the folded path is held
    to the float64 reference at twice the unfolded path's error (or `bound` where that is larger):
    the fold must cost no accuracy, whatever bf16 costs both paths."""
    ref, fast = layers(method, device, dtype, n_head, d_model, window)
    torch.manual_seed(1)
    x = torch.randn(2, T, d_model).to(dtype).double()
    segments = torch.tensor([[0] * (T // 3) + [1] * (T - T // 3), [4] * T], device=device) if docs else None
    x, w = x.to(device), torch.randn(2, T, d_model, dtype=torch.float64).to(device)
    calls = Calls(monkeypatch)
    got = forward_backward(fast, x.to(dtype), w, segments)
    assert calls.scaled == 0 and calls.reductions == 0, "the temperature scaled q, or reduced it, with ops of its own"
    assert len(calls.factors) == 1 and calls.factors[0] is not None, "the fused kernels got no factor"
    monkeypatch.setattr(Attention, "folds_temperature", lambda *a, **k: False)  # the unfolded path, same kernels
    unfolded = forward_backward(fast, x.to(dtype), w, segments)
    assert calls.scaled == 2 and calls.factors[1] is None
    names = ["out", "dx"] + [n for n, _ in fast.named_parameters()]
    if bound is not None:
        want = forward_backward(ref, x, w, segments)
        for name, a, b, c in zip(names, got, unfolded, want):
            err, base = rel_err(a, c), rel_err(b, c)
            assert err <= max(bound, 2 * base), f"{method} {name}: {err:.2e} off float64, the unfolded path {base:.2e}"
        return
    for name, a, b in zip(names, got, unfolded):
        assert_close(a.double().cpu(), b.double().cpu(), tol, f"{method} {name} against the unfolded path")
    if ref_tol is not None:
        want = forward_backward(ref, x, w, segments)
        for name, a, c in zip(names, got, want):
            assert_close(a.double(), c, ref_tol, f"{method} {name} against the float64 reference")


@pytest.mark.parametrize("method,window,docs", [("ssmax-kerple", 0, False), ("logn-kerple", 0, False),
                                                ("l4temp-alibi", 0, False), ("ssmax-t5", 0, False),
                                                ("ssmax-fox", 0, False), ("logn-kerple-power", 0, False),
                                                ("ssmax-kerple", 17, False), ("ssmax-alibi", 0, True),
                                                ("l4temp-fox", 9, True)])
def test_the_fused_kernels_take_the_factor_and_match_the_unfolded_path(method, window, docs, monkeypatch):
    run_fold(method, monkeypatch, window=window, docs=docs)


def test_the_bound_against_the_unfolded_path(monkeypatch):
    """The bf16 GPU cases' check (the folded path within twice the unfolded path's error off
    float64, or the bound), here in fp32 where both paths are near exact."""
    run_fold("ssmax-fox", monkeypatch, T=40, docs=True, bound=1e-4)


def test_a_folded_ssmax_keeps_no_more_of_q_s_size_than_its_base():
    """The folded SSMax keeps the unscaled q for s_h's gradient, the one the kernels keep: the
    tensors of q's size kept for the backward are as many storages as Kerple's own."""
    def kept(method):
        _, layer = layers(method, "cpu", torch.float32)
        x = torch.randn(2, 40, 48)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            layer(x.requires_grad_())
        return {t.untyped_storage().data_ptr() for t in saved if t.numel() >= 2 * 40 * 48}

    assert len(kept("ssmax-kerple")) == len(kept("kerple"))


def test_kernels_that_take_no_factor_get_q_scaled():
    """DAPE V2's kernels take no factor: the layer scales q first, and the backends refuse a factor
    where they have no use for it (one-line errors)."""
    _, layer = layers("logn-dapev2-kerple", "cpu", torch.float32)
    assert not layer.folds_temperature(torch.device("cpu"))
    _, layer = layers("ssmax-kerple", "cpu", torch.float32)
    assert layer.folds_temperature(torch.device("cpu"))
    q = torch.randn(1, 3, 8, 16)
    for backend in ("dense", "chunked"):
        with pytest.raises(ValueError, match=f"backend '{backend}' takes no q_scale"):
            run_backend(backend, q, q, q, layer.parts, q_scale=torch.ones(8))
    dape, _ = layers("logn-dapev2-kerple", "cpu", torch.float32)
    with pytest.raises(ValueError, match="takes no q_scale"):
        run_backend("triton", q, q, q, dape.parts, q_scale=torch.ones(8))


def test_a_prefill_scales_q_itself_and_gives_the_forward_s_logits(monkeypatch):
    """A forward that writes a cache keeps the scaled q (the cache may keep q): no fold there; its
    logits are the folded forward's."""
    model = model_for("ssmax-kerple", n_head=1, d_model=16, **SHORT).float()
    for block in model.blocks:
        block.attn.backend_for = lambda device, segments=False: "triton"
    calls = Calls(monkeypatch)
    idx = torch.randint(0, V, (2, 12))
    with torch.no_grad():
        full = model(idx)[0]
        assert calls.scaled == 0 and len(calls.factors) == 2 and all(f is not None for f in calls.factors)
        last = model.prefill(idx, model.new_cache(2, 12))
    assert calls.scaled == 2 and calls.factors[2:] == [None, None]
    assert_close(last, full[:, -1], 1e-5, "prefill")


# --- on a GPU: the planner's own choice, the 125m shape in bf16 -----------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method,window,docs", [("ssmax-kerple", 0, False), ("logn-kerple", 0, False),
                                                ("l4temp-kerple", 129, True), ("ssmax-fox", 0, True)])
def test_gpu_the_fused_kernels_take_the_factor_125m(method, window, docs, dtype, monkeypatch):
    """H 12, d 64, T 1000. fp32 (the kernels' exact-product path): against the unfolded path (q
    scaled first, the same kernels) at 1e-4 and the float64 reference at 1e-3, as the other GPU
    module tests. bf16: each against the float64 reference, the folded path within twice the
    unfolded path's error or 2e-2 (the two differ by the rounding of q f to bf16, which the fold
    skips, and every bf16 rounding after it; FoX's gate gradient sums signed terms over the rows)."""
    probe = Attention(AttentionConfig(method=method, window=window, **SHORT), 12, 768)
    assert probe.backend_for(torch.device("cuda"), docs) == "triton"
    tols = dict(tol=1e-4, ref_tol=1e-3) if dtype == torch.float32 else dict(bound=2e-2)
    run_fold(method, monkeypatch, "cuda", dtype, 12, 768, 1000, window, docs, **tols)
