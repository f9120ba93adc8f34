"""lenx.ops.head_dot: the per-head dot product sum over b, t, d of x y -> [H] (SSMax's s_h gradient).
The reference against a float64 einsum, the kernel (triton.py) against float64 at odd sizes, in the
layouts the attention hands it (contiguous, heads-last [B, T, H, d] in memory, a strided view of the
projection's output), and route.py's choice. Without CUDA the kernel runs under Triton's
interpreter (tests/conftest.py)."""

import pytest
import torch

from kernel_cases import CUDA, DEVICE
from lenx.ops.head_dot import reference, route


def exact(x, y):
    """float64 sum over b, t, d of x y, and of |x y| (the scale of its rounding error)."""
    p = x.double() * y.double()
    return p.sum((0, 2, 3)), p.abs().sum((0, 2, 3))


def tensor(B, H, T, d, layout, dtype):
    """x [B, H, T, d] in memory as layout says: contiguous, heads_last ([B, T, H, d]) or strided (q's
    slot of a [B, T, 3, H, d] projection output, d's stride 1)."""
    if layout == "heads_last":
        return torch.randn(B, T, H, d, device=DEVICE).to(dtype).transpose(1, 2)
    if layout == "strided":
        return torch.randn(B, T, 3, H, d, device=DEVICE).to(dtype)[:, :, 1].transpose(1, 2)
    return torch.randn(B, H, T, d, device=DEVICE).to(dtype)


def check(x, y, tol=1e-6):
    """The kernel within tol of the float64 sum, relative to sum |x y| (fp32 products of bf16 or fp32
    inputs, summed in fp32: the bound is fp32's accumulation, far above what it measures)."""
    from lenx.ops.head_dot.triton import head_dot

    got = head_dot(x, y)
    want, scale = exact(x, y)
    assert got.dtype == torch.float32 and got.shape == want.shape
    err = ((got.double() - want).abs() / scale.clamp(min=1e-30)).max().item()
    assert err < tol, f"{tuple(x.shape)} {x.dtype}: error {err:.2e} of sum |x y|"
    return got


def test_reference_is_the_definition():
    x, y = (torch.randn(2, 3, 5, 7, dtype=torch.float64) for _ in range(2))
    assert torch.allclose(reference.head_dot(x, y), torch.einsum("bhtd,bhtd->h", x, y), rtol=1e-14, atol=0)
    assert reference.head_dot(x.float(), y.float()).dtype == torch.float32


pytest.importorskip("triton")


@pytest.mark.parametrize("T", [1, 63, 111])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layouts", [("contiguous", "contiguous"), ("heads_last", "contiguous"),
                                     ("heads_last", "strided")])
def test_kernel_against_float64(T, dtype, layouts):
    """x (SDPA's dq) and y (the rotation's q) each in their own layout, read with no copy."""
    x, y = (tensor(2, 12, T, 64, layout, dtype) for layout in layouts)
    check(x, y)


@pytest.mark.parametrize("H,d", [(1, 64), (1, 7), (12, 24), (3, 128)])
def test_kernel_odd_heads_and_head_dims(H, d):
    check(tensor(3, H, 37, d, "heads_last", torch.float32), tensor(3, H, 37, d, "strided", torch.float32))


def test_kernel_any_strides_and_several_tiles_per_chunk():
    """d not the innermost dim (a transposed view), a batch broadcast with stride 0 (as autograd
    expands a sum's gradient), and few programs: each sums many tiles of rows."""
    from lenx.ops.head_dot.triton import head_dot

    x = torch.randn(2, 3, 16, 50, device=DEVICE).transpose(2, 3)  # [2, 3, 50, 16], d's stride 50
    for y in (torch.randn(2, 3, 50, 16, device=DEVICE), torch.randn(1, 3, 50, 16, device=DEVICE).expand(2, -1, -1, -1)):
        want, scale = exact(x, y)
        for programs, rows in ((3, 4), (1, 16), (512, None)):
            got = head_dot(x, y, programs=programs, block_rows=rows)
            assert ((got.double() - want).abs() <= 1e-6 * scale).all(), (programs, rows)


def test_kernel_is_more_accurate_than_the_bf16_products():
    """The plain expression rounds each bf16 product to bf16 (8 bits) before summing; the kernel
    keeps it in fp32 (exact: 8 x 8 bits fit fp32's 24): its error is orders of magnitude smaller."""
    x, y = (tensor(2, 2, 256, 64, "contiguous", torch.bfloat16) for _ in range(2))
    want, scale = exact(x, y)
    old = torch.sum(x * y, dim=(0, 2, 3), dtype=torch.float32)
    new = check(x, y)
    assert ((new.double() - want).abs() * 100 < (old.double() - want).abs()).all()


@pytest.mark.skipif(CUDA, reason="checks the interpreter's memory accesses")
def test_kernel_reads_inside_its_inputs_only():
    from kernel_cases import bounds_checked

    with bounds_checked():
        check(tensor(2, 3, 63, 24, "strided", torch.bfloat16), tensor(2, 3, 63, 24, "heads_last", torch.bfloat16))


def test_bad_inputs_are_one_line_errors():
    from lenx.ops.head_dot.triton import head_dot

    x = torch.randn(2, 3, 4, 8, device=DEVICE)
    for a, b in ((x, x[:, :2]), (x, x.double()), (x.double(), x.double()), (x[0], x[0])):
        with pytest.raises(ValueError, match="one shape and dtype") as err:
            head_dot(a, b)
        assert "\n" not in str(err.value)
    assert torch.equal(head_dot(x[:, :, :0], x[:, :, :0]), torch.zeros(3, device=DEVICE))


def test_route_takes_the_kernel_where_it_applies(monkeypatch):
    """The kernel for fp16/bf16/fp32 on CUDA or under the interpreter; the reference for float64, and on
    the CPU without the interpreter."""
    from lenx.ops.head_dot import triton as kernel

    calls = []
    launch = kernel.head_dot
    monkeypatch.setattr(kernel, "head_dot", lambda x, y: calls.append(x.dtype) or launch(x, y))
    if not CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # as conftest sets it
    x = torch.randn(2, 3, 5, 8, device=DEVICE)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        a, b = x.to(dtype), x.flip(2).to(dtype)
        want, scale = exact(a, b)
        assert ((route.head_dot(a, b).double() - want).abs() <= 1e-5 * scale).all(), dtype
    assert calls == [torch.float32, torch.bfloat16]
    if not CUDA:
        monkeypatch.delenv("TRITON_INTERPRET")
        assert not route.uses_triton(x, x) and len(calls) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("layouts", [("heads_last", "contiguous"), ("contiguous", "contiguous")])
def test_gpu_kernel_125m_shape(layouts):
    """The 125m model's step at T 512 (B 8 here; 12 heads, d 64, bf16): against float64, and the same
    bits on a second call (no atomics)."""
    x, y = (tensor(8, 12, 512, 64, layout, torch.bfloat16) for layout in layouts)
    got = check(x, y)
    from lenx.ops.head_dot.triton import head_dot

    assert torch.equal(head_dot(x, y), got)
