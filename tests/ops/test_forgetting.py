"""lenx.ops.forgetting: the reference against a direct computation, and the fused kernels (triton.py)
against the float64 reference, the output and every gradient, the gradient to c included. Without
CUDA the kernels run under Triton's interpreter at small sizes; the gpu tests add long sequences in
bf16 and fp32 with FoX's own prefix sums (c near -0.7 t)."""

import math

import pytest
import torch
from torch.nn import functional as F

from kernel_cases import CUDA, DEVICE, bounds_checked, causal_gap, compare, leaf, one_key_floors, tolerance
from lenx.ops.forgetting.reference import forgetting_reference


def test_reference_matches_rowwise_softmax():
    """Each row on its own in float64: softmax over keys 0..i of q_i.k_j / sqrt(d) + sum_{l=j+1..i} log f_l."""
    B, H, T, d = 2, 3, 9, 8
    q, k, v = (torch.randn(B, H, T, d, dtype=torch.float64) for _ in range(3))
    log_f = F.logsigmoid(torch.randn(B, H, T, dtype=torch.float64))
    out = forgetting_reference(q, k, v, log_f.cumsum(-1))
    for b in range(B):
        for h in range(H):
            for i in range(T):
                logits = torch.stack([q[b, h, i] @ k[b, h, j] / math.sqrt(d) + log_f[b, h, j + 1: i + 1].sum()
                                      for j in range(i + 1)])
                expected = (logits.softmax(0)[:, None] * v[b, h, : i + 1]).sum(0)
                assert torch.allclose(out[b, h, i], expected, atol=1e-12)


pytest.importorskip("triton")
from lenx.ops.forgetting import triton as kernel  # noqa: E402


def fox_c(B, H, T, spread=1.0, offset=0.0, gate=0.0):
    """A leaf c [B, H, T] in fp32: prefix sums of log f with f = sigmoid(spread N(0, 1) + gate) (spread
    0, gate 0: f = 0.5 everywhere, FoX at its initialisation: c_t = -0.69 (t + 1); gate 5: f ~ 0.993,
    slow forgetting, far keys keep their weight), plus offset (the bias c_i - c_j ignores it: it
    stands for the prefix before a long sequence's last positions)."""
    log_f = F.logsigmoid(spread * torch.randn(B, H, T, device=DEVICE, dtype=torch.float64) + gate)
    return (log_f.cumsum(-1) + offset).float().requires_grad_()


def run_fox(B, H, T, d, dtype, spread=1.0, offset=0.0, gate=0.0, tol=None, config=None):
    """The kernel in `dtype` against the float64 reference on the same (rounded) inputs: out, dq,
    dk, dv and dc. The reference's dc has the row sums of dS too (zero up to rounding), the kernel's
    only the column sums: the comparison checks that leaving them out is exact."""
    torch.manual_seed(0)
    q, k, v = (leaf(B, H, T, d, dtype=dtype) for _ in range(3))
    c = fox_c(B, H, T, spread, offset, gate)
    do = torch.randn(B, H, T, d, device=DEVICE)
    out = kernel.forgetting_attention(q, k, v, c, config=config)
    assert out.dtype == dtype
    grads = torch.autograd.grad(out, (q, k, v, c), do.to(dtype))
    refs = [x.detach().double().requires_grad_() for x in (q, k, v, c)]
    ref = forgetting_reference(*refs)
    ref_grads = torch.autograd.grad(ref, refs, do.double())
    names = ["out", "dq", "dk", "dv", "dc"]
    floors = one_key_floors(names, ref_grads[2]) if T == 1 else {}
    compare(f"fox B{B} H{H} T{T} d{d} {dtype} spread {spread} offset {offset} gate {gate}", [out, *grads],
            [ref, *ref_grads], names, tol or tolerance(dtype), floors)


# --- small sizes: the interpreter on CPU (and the compiled kernels on a GPU) ------------------

@pytest.mark.parametrize("T", [1, 63, 111])
@pytest.mark.parametrize("d", [16, 64])
def test_fox_small(T, d):
    run_fox(2, 2, T, d, torch.float32)


def test_fox_small_bounds_and_init_gates():
    """Every load and store inside its tensors (several query and key tiles, padding rows), with
    FoX's initial gates (f = 0.5: c falls by 0.69 a position, the bias spans ~90 at T 130)."""
    if CUDA:
        pytest.skip("the interpreter's bounds check")
    with bounds_checked():
        run_fox(1, 2, 130, 16, torch.float32, spread=0.0)


def test_fox_small_large_c():
    """c in the thousands, as at the end of an 8192-token sequence (c_t ~ -0.69 t at initialisation):
    the kernel takes c at the query block's first row from both vectors before scaling them, so
    the near-diagonal entries keep fp32's precision (scaling c itself by log2(e) would round each
    to ~5e-4 and miss fp32's bound)."""
    run_fox(1, 2, 70, 16, torch.float32, offset=-6000.0, tol=1e-5)  # measured 9e-7; 1.1e-4 without the shift


def test_fox_small_half_tiles():
    """The half-precision tiles (CONFIG: 64 x 64 forward, 64 x 32 dq) on several blocks, to their
    bound; fp16 under the interpreter, whose bf16 products are wrong (so for biased_attention)."""
    run_fox(1, 2, 150, 32, torch.bfloat16 if CUDA else torch.float16)


def test_fox_row_sums_of_ds_vanish():
    """Why the kernel leaves the rows' part of dc out: in float64 the row sums of dS are zero to
    rounding, so dc from the column sums alone equals autograd's whole dc."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 16, dtype=torch.float64) for _ in range(3))
    c = F.logsigmoid(torch.randn(1, 2, 40, dtype=torch.float64)).cumsum(-1)
    bias = (c[..., :, None] - c[..., None, :]).requires_grad_()
    scores = q @ k.transpose(-1, -2) / 4 + bias
    allowed = torch.ones(40, 40, dtype=torch.bool).tril()
    out = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
    ds, = torch.autograd.grad(out, bias, torch.randn_like(out))
    assert ds.sum(-1).abs().max() < 1e-12 * ds.abs().max() * 40
    assert ds.sum(-2).abs().max() > 1e-3 * ds.abs().max()  # the column sums are not


def test_fox_rejects_bad_arguments():
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    c = torch.zeros(1, 2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="c must be fp32"):
        kernel.forgetting_attention(q, q, q, c[..., :5])
    with pytest.raises(ValueError, match="c must be fp32"):
        kernel.forgetting_attention(q, q, q, c.double())
    with pytest.raises(ValueError, match="head dims"):
        kernel.forgetting_attention(*(torch.randn(1, 2, 8, 12, device=DEVICE),) * 3, c)


def test_causal():
    """Outputs at positions <= t do not move when q, k, v and c after t change."""
    T, t = (40, 17) if not CUDA else (300, 150)
    c = fox_c(1, 2, T).detach()
    c2 = c.clone()
    c2[..., t + 1:] = fox_c(1, 2, T - t - 1).detach() + c[..., t:t + 1]
    gap = causal_gap(lambda q, k, v: (kernel.forgetting_attention(q, k, v, c),), T, t)
    assert gap < 1e-6
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, T, 16, device=DEVICE) for _ in range(3))
    with torch.no_grad():
        a, b = (kernel.forgetting_attention(q, k, v, x) for x in (c, c2))
    assert float((a[:, :, : t + 1] - b[:, :, : t + 1]).abs().max()) < 1e-6
    assert float((a[:, :, t + 1:] - b[:, :, t + 1:]).abs().max()) > 1e-3  # the change did reach the later rows


# --- long sequences in bf16 and fp32: the compiled kernels on a GPU ---------------------------
# Against the float64 reference on the same rounded inputs, to the bounds the biased-softmax kernels
# meet (1e-2 bf16, 1e-4 fp32). T 8192 with 2 heads: the reference's float64 score maps are 1 GB each.

@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 111, 1000, 8192])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_fox(T, dtype):
    """Random gates at T <= 1000 (12 heads); FoX's initial gates (f = 0.5, c down to -5.7k) at 8192."""
    long = T >= 4096
    run_fox(1 if long else 2, 2 if long else 12, T, 64, dtype, spread=0.0 if long else 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("T,d,gate", [(8192, 64, 5.0), (1000, 128, 0.0), (1000, 32, 3.0)])
def test_gpu_fox_slow_gates_and_widths(T, d, gate):
    """Slow forgetting (gate 5: every key of 8192 keeps some weight), head dims 128 (the wide tiles)
    and 32, in bf16."""
    run_fox(1, 2, T, d, torch.bfloat16, gate=gate)
