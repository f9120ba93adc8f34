"""lenx.attention.profiling: the attention's profiler ranges (CPU)."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from lenx.attention import Attention, AttentionConfig
from lenx.attention.profiling import BACKWARD, FORWARD, active, attention_profile, attention_ranges
from lenx.config import LMConfig
from lenx.model import LM

MARKERS = ("_OpenBackward", "_CloseBackward")


def _graph_names(t: torch.Tensor) -> set[str]:
    """The names of every node of t's autograd graph."""
    seen, todo, names = set(), [t.grad_fn], set()
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.add(type(fn).__name__)
        todo += [f for f, _ in fn.next_functions]
    return names


def test_switch_is_off_by_default_and_restored():
    assert not active()
    with attention_ranges():
        assert active()
        with attention_ranges(False):
            assert not active()
        assert active()
    with pytest.raises(RuntimeError), attention_ranges():
        raise RuntimeError("boom")
    assert not active()


def test_off_adds_no_node_and_on_changes_no_value():
    torch.manual_seed(0)
    attn = Attention(AttentionConfig(method="kerple", backend="dense"), 2, 16)
    x = torch.randn(1, 8, 16, requires_grad=True)
    out = attn(x)
    assert not any(m in name for name in _graph_names(out) for m in MARKERS)
    grads = torch.autograd.grad(out.square().sum(), [x, *attn.parameters()])
    with attention_ranges():
        marked = attn(x)
        marked_grads = torch.autograd.grad(marked.square().sum(), [x, *attn.parameters()])
        names = _graph_names(marked)
        with torch.no_grad():  # no backward: no marker, the forward range alone
            assert attn(x).grad_fn is None
    assert all(any(m in name for name in names) for m in MARKERS)
    torch.testing.assert_close(marked, out, rtol=0, atol=0)
    for a, b in zip(marked_grads, grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# (method, backend, an op of the attention's forward, one of its backward): each must lie inside
# the attention's ranges wherever it occurs; the MLP's and LayerNorm's ops never
CASES = [
    ("kerple", "dense", "aten::_softmax", "aten::_softmax_backward_data"),
    ("stickbreaking", "dense", "aten::log_sigmoid_forward", "aten::log_sigmoid_backward"),
    ("dapev2-kerple", "chunked", "aten::mkldnn_convolution", "aten::convolution_backward"),
    ("rope", "sdpa", "aten::_scaled_dot_product_flash_attention_for_cpu",
     "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
]


@pytest.mark.parametrize("method,backend,fwd_op,bwd_op", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_ranges_hold_exactly_the_attention(method, backend, fwd_op, bwd_op):
    """The backward range (opened by the output's marker, closed by the inputs') holds every
    backward op of the attention and no op of the rest of the model, in every layer."""
    torch.manual_seed(0)
    n_layer = 3
    model = LM(LMConfig(method=method, backend=backend, n_layer=n_layer, n_head=2, d_model=32, vocab_size=40,
                        chunk_size=8))
    x = torch.randint(0, 40, (2, 16))
    with attention_ranges(), profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        _, loss = model(x, x)
        loss.backward()
    events = prof.events()
    p = attention_profile(events, kernels=False)
    assert p.ranges == {FORWARD: n_layer, BACKWARD: n_layer}
    count = lambda name: sum(e.name == name for e in events)  # noqa: E731
    inside = lambda kind, name: p.by_name[kind].get(name, [0, 0])[1]  # noqa: E731
    assert count(bwd_op) >= n_layer and inside(BACKWARD, bwd_op) == count(bwd_op)
    assert count(fwd_op) >= n_layer and inside(FORWARD, fwd_op) + inside(BACKWARD, fwd_op) == count(fwd_op)
    assert inside(FORWARD, fwd_op) >= n_layer  # (the chunked path recomputes its forward in backward)
    for op in ("aten::gelu", "aten::gelu_backward", "aten::native_layer_norm", "aten::native_layer_norm_backward",
               "aten::nll_loss_backward"):
        assert count(op) > 0 and inside(FORWARD, op) == inside(BACKWARD, op) == 0, op
        assert p.outside[op, "-"][1] == count(op), op  # outside, on the CPU's one thread
    assert 0 < p.forward_us and 0 < p.backward_us and p.forward_us + p.backward_us < p.total_us
    assert p.unlinked_us == 0  # every CPU op is its own "launcher"
