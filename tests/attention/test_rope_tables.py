"""RoPE's step overhead: one cos/sin table per model and length (attention.rope.TableCache) instead of
one per layer and forward, the fused rotation's layout for SDPA (heads_last), and the PyTorch rotation
on a machine without triton. The fused path is exercised on the CPU by pointing rope.FUSED_DEVICE at
it (Triton's interpreter runs the kernel), against the float64 rotation written out pair by pair."""

import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from helpers import assert_close
from lenx.attention import Attention, AttentionConfig
from lenx.attention import rope as rope_module
from lenx.attention.rope import RoPE
from lenx.config import LMConfig
from lenx.model import LM

D = 16


def by_hand(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """float64: pair (i, i + D/2) turned by pos * 10000^(-2i/D)."""
    out, half = x.double().clone(), D // 2
    for i in range(half):
        angle = pos.double() * 10000.0 ** (-2 * i / D)
        a, b = x[..., i].double(), x[..., i + half].double()
        out[..., i] = a * angle.cos() - b * angle.sin()
        out[..., i + half] = b * angle.cos() + a * angle.sin()
    return out


def table_ops(fn) -> int:
    """The cos and sin ops that fn() runs (a table's build runs one of each)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.name in ("aten::cos", "aten::sin") for e in prof.events())


def test_layers_share_one_table_per_length():
    """Three RoPE layers: the first forward builds one table (not three), later forwards of that
    length none; another length one more; explicit positions one per positions tensor."""
    torch.manual_seed(0)
    model = LM(LMConfig(method="rope", n_layer=3, n_head=2, d_model=2 * D, vocab_size=40))
    x = torch.randint(0, 40, (2, 12))
    tables = model.blocks[0].attn.rope.tables
    assert all(b.attn.rope.tables is tables for b in model.blocks)
    with torch.no_grad():
        assert table_ops(lambda: model(x)) == 2 and tables.builds == 1
        assert table_ops(lambda: model(x)) == 0 and tables.builds == 1
        assert table_ops(lambda: model(x[:, :7])) == 2 and tables.builds == 2
        docs = torch.tensor([[0] * 5 + [1] * 7, [0] * 12])  # positions restart at each document: per-sequence tables
        assert table_ops(lambda: model(x, doc_ids=docs)) == 2 and tables.builds == 3
        assert table_ops(lambda: model(x, doc_ids=docs)) == 2 and tables.builds == 4  # new positions, new table


def test_cached_tables_rotate_exactly():
    """A table reused across calls is the table of those positions: the default ones, explicit ones,
    and positions changed in place (their version), against the float64 rotation."""
    rope = RoPE(D).double()
    q, k = torch.randn(2, 2, 3, 9, D, dtype=torch.float64)
    default = torch.arange(9)
    for pos in (None, None, default + 4, default * 2):
        ref = default if pos is None else pos
        qr, kr = rope(q, k, pos)
        assert_close(qr, by_hand(q, ref), 1e-6)  # (the frequencies are fp32)
        assert_close(kr, by_hand(k, ref), 1e-6)
    pos = default.clone()
    rope(q, k, pos)
    pos.add_(5)  # the same tensor, new values
    assert_close(rope(q, k, pos)[0], by_hand(q, default + 5), 1e-6)
    assert rope.tables.builds == 5  # None once, then each positions tensor (and version) once


def test_table_made_in_inference_mode_is_not_reused_for_training():
    """Evaluating under inference_mode and then training at the same length: the training forward
    gets a table it may save for its backward."""
    rope = RoPE(D)
    q, k = (torch.randn(1, 2, 5, D, requires_grad=True) for _ in range(2))
    with torch.inference_mode():
        rope(q.detach(), k.detach())
    qr, kr = rope(q, k)
    (qr.square().sum() + kr.sum()).backward()  # an inference tensor saved for backward would raise
    assert q.grad is not None and rope.tables.builds == 2


def test_cpu_without_triton_rotates_with_pytorch(monkeypatch):
    """With triton absent (find_spec None; importing it would fail), a device the fused kernel runs
    on rotates with the PyTorch ops, no error."""
    monkeypatch.setattr(rope_module, "FUSED_DEVICE", "cpu")
    monkeypatch.setattr(rope_module.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.delitem(sys.modules, "lenx.ops.rope.triton", raising=False)
    rope = RoPE(D)
    q, k = torch.randn(2, 1, 2, 7, D)
    qr, kr = rope(q, k, heads_last=True)
    assert_close(qr, by_hand(q, torch.arange(7)), 1e-5)
    assert_close(kr, by_hand(k, torch.arange(7)), 1e-5)
    qkv = torch.randn(1, 7, 3, 2, D)  # the attention's path: the projection's output
    qr, kr, v = rope.project(qkv, heads_last=True)
    assert_close(kr, by_hand(qkv[:, :, 1].transpose(1, 2), torch.arange(7)), 1e-5)
    assert torch.equal(v, qkv[:, :, 2].transpose(1, 2))
    assert not rope_module.triton_available()


def test_q_scale_only_where_the_kernel_rotates():
    """The PyTorch rotation takes no row factor: asked for one (forward or project), a one-line error
    instead of a temperature silently dropped."""
    rope = RoPE(D)
    q, k = torch.randn(2, 1, 2, 7, D)
    with pytest.raises(ValueError, match="only in its fused kernel"):
        rope(q, k, q_scale=torch.ones(7))
    with pytest.raises(ValueError, match="only in its fused kernel"):
        rope.project(torch.randn(1, 7, 3, 2, D), q_scale=torch.ones(7))


def test_fused_path_layout_for_sdpa(monkeypatch):
    """With the fused kernel (interpreted on the CPU): heads_last gives [B, T, H, d] memory, and an
    attention layer asks for it exactly when its backend is SDPA; the values are the rotation's."""
    pytest.importorskip("triton")
    monkeypatch.setattr(rope_module, "FUSED_DEVICE", "cpu")
    rope = RoPE(D)
    q, k = (torch.randn(2, 3, 7, D, requires_grad=True) for _ in range(2))
    qr, kr = rope(q, k, heads_last=True)
    assert qr.shape == q.shape and qr.transpose(1, 2).is_contiguous() and kr.transpose(1, 2).is_contiguous()
    assert_close(qr, by_hand(q, torch.arange(7)), 1e-5)
    dq, = torch.autograd.grad(qr.sum() + kr.sum(), [q])
    assert dq.is_contiguous()
    torch.manual_seed(0)
    x = torch.randn(2, 7, 2 * D)
    for backend, heads_last in (("sdpa", True), ("chunked", False)):
        attn = Attention(AttentionConfig(method="rope", backend=backend), 2, 2 * D)
        q, k, _ = attn.project(x)
        assert q.transpose(1, 2).is_contiguous() == heads_last and q.is_contiguous() != heads_last, backend


@pytest.mark.parametrize("method,backend", [("rope", "sdpa"), ("logn-rope", "chunked")])
def test_fused_layers_match_the_pytorch_rotation(monkeypatch, method, backend):
    """An LM whose layers rotate in the kernel (reading the projection's output, its backward writing
    the projection's gradient) against the same LM rotating with PyTorch ops: loss and every
    gradient, with document positions; the fused path is the one taken."""
    pytest.importorskip("triton")
    torch.manual_seed(0)
    model = LM(LMConfig(method=method, backend=backend, n_layer=2, n_head=2, d_model=2 * D, vocab_size=40,
                        rope_fraction=0.5, temp_train_len=8))
    x = torch.randint(0, 40, (2, 12))
    docs = torch.tensor([[0] * 5 + [1] * 7, [0] * 12])

    def run():
        model.zero_grad()
        loss = model(x, x, docs)[1]
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    loss, grads = run()
    monkeypatch.setattr(rope_module, "FUSED_DEVICE", "cpu")
    attn = model.blocks[0].attn
    assert type(attn.project(torch.randn(1, 3, 2 * D))[1].grad_fn).__name__ == "_RotateQKVBackward"  # k
    fused_loss, fused_grads = run()
    assert_close(fused_loss, loss, 1e-6)
    for a, b in zip(fused_grads, grads):
        assert_close(a, b, 1e-5)


@pytest.mark.parametrize("method", ["rope", "ssmax-rope"])
def test_fused_step_copies_nothing_outside_the_rotation(monkeypatch, method):
    """A training step's forward and backward of a fused RoPE LM (2 layers; the second step): outside
    the attention's ranges and the rotation's own launches, no table op and no copy: no per-layer table,
    no stack of dq, dk, dv and no copy of it to the projection's layout (the backward writes the
    projection's gradient itself). With a query temperature, the rotation scales q's rows: no pass
    of the temperature's own (_ScaleRows) either way, and its table built once for both layers."""
    pytest.importorskip("triton")
    from lenx.attention.profiling import BACKWARD, FORWARD, attention_ranges

    from lenx.ops.head_dot import route

    monkeypatch.setattr(rope_module, "FUSED_DEVICE", "cpu")
    # SSMax's s_h reduction in the plain ops: under Triton's interpreter its kernel copies its
    # arguments (no copies on a GPU, where it is one launch)
    monkeypatch.setattr(route, "uses_triton", lambda x, y: False)
    torch.manual_seed(0)
    model = LM(LMConfig(method=method, n_layer=2, n_head=2, d_model=2 * D, vocab_size=40))
    x = torch.randint(0, 40, (2, 12))
    with attention_ranges():
        model(x, x)[1].backward()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(x, x)[1].backward()
    events = prof.events()
    apart = [e.time_range for e in events if e.name in (FORWARD, BACKWARD, "_RotateQKV", "_RotateQKVBackward")]
    outside = [e.name for e in events if not any(r.start <= e.time_range.start <= r.end for r in apart)]
    for op in ("aten::cos", "aten::sin", "aten::stack", "aten::cat", "aten::clone"):
        assert op not in outside, op
    # a temperature's key counts cast to fp32 once per forward (its table, shared by the layers)
    assert outside.count("aten::copy_") == (0 if method == "rope" else 1)
    assert sum(e.name == "_RotateQKV" for e in events) == 2 and sum(e.name == "_RotateQKVBackward" for e in events) == 2
    assert not any("_ScaleRows" in e.name for e in events)


@pytest.mark.gpu
def test_gpu_sdpa_output_reaches_the_projection_without_a_copy():
    """On CUDA (bf16, the training step's autocast): RoPE's q and k are [B, T, H, d] in memory, SDPA's
    output takes that layout, so the output projection reads it as [B, T, C] with no copy; the layer
    matches its CPU (unfused) forward."""
    torch.manual_seed(0)
    attn = Attention(AttentionConfig(method="rope"), 12, 768)
    x = torch.randn(2, 256, 768)
    cpu = attn(x)
    attn.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        q, k, v = attn.project(x.cuda())
        out = attn.attend(q, k, v)
        gpu = attn(x.cuda())
    assert attn.backend_for(q.device) == "sdpa" and q.transpose(1, 2).is_contiguous()
    assert out.transpose(1, 2).is_contiguous(), out.stride()
    assert_close(gpu.float().cpu(), cpu, 2e-2)
