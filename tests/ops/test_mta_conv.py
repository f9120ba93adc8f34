"""lenx.ops.mta.conv: the Triton stencil of MTA's query-key convolution against reference._conv's
F.conv2d in float64 (fp32 inputs to the kernel), forward and both gradients; the routing of
lenx.ops.mta.route. Without CUDA the kernels run under Triton's interpreter (tests/conftest.py)."""

import pytest
import torch

from helpers import assert_close
from kernel_cases import DEVICE
from lenx.ops.mta import route
from lenx.ops.mta.reference import _conv

TOL = 1e-5  # fp32 products and sums of at most ~100 taps (dw: over B Tq Tk) against float64


def inputs(B, H, Tq, Tk, c_q, c_k, dtype=torch.float32):
    x = torch.randn(B, H, Tq, Tk, device=DEVICE).to(dtype).requires_grad_()
    w = torch.randn(H, 1, c_q, c_k, device=DEVICE, requires_grad=True)  # a kernel of its own per head
    return x, w


def against_conv2d(x, w, tol=TOL, tiles=None, what=""):
    """The output, dx and dw of mta_conv against F.conv2d in float64 on the same values."""
    from lenx.ops.mta.conv import mta_conv

    y = mta_conv(x, w, tiles)
    assert y.dtype == x.dtype and y.shape == x.shape
    g = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, w), g)
    xd, wd = (t.detach().double().requires_grad_() for t in (x, w))
    want = _conv(xd, wd)
    want_dx, want_dw = torch.autograd.grad(want, (xd, wd), g.double())
    assert dx.dtype == x.dtype and dw.dtype == w.dtype and dw.shape == w.shape
    for name, got, ref in (("y", y, want), ("dx", dx, want_dx), ("dw", dw, want_dw)):
        assert_close(got, ref, tol, f"{what} {name}")


pytest.importorskip("triton")


# every kernel at T 1 and 63, the small ones at 111 too (the 6 x 11 kernel at 111 took 90 s under the
# interpreter and tests nothing 63 does not: both lengths end in a partial tile)
SQUARE = [(T, kernel) for T in (1, 63) for kernel in ((6, 11), (1, 1), (3, 5), (2, 3))] + \
    [(111, (1, 1)), (111, (3, 5)), (111, (2, 3))]


@pytest.mark.parametrize("T, kernel", SQUARE)
def test_square_maps(T, kernel):
    against_conv2d(*inputs(1, 2, T, T, *kernel), what=f"T{T} {kernel}")


@pytest.mark.parametrize("Tq, Tk", [(21, 100), (5, 70), (24, 9)])
def test_a_block_of_rows(Tq, Tk):
    """The chunked path's maps: a block of rows (its query halo included) against keys beyond it."""
    against_conv2d(*inputs(1, 2, Tq, Tk, 6, 11), what=f"Tq{Tq} Tk{Tk}")


@pytest.mark.parametrize("Tq, Tk, kernel", [(37, 24, (3, 5)), (20, 24, (6, 11))])
def test_tile_edges_mid_map(Tq, Tk, kernel):
    """16 x 16 tiles: rows and keys cross tile edges, the last tiles partial (37 = 2 x 16 + 5, 24 = 16 +
    8), and a tap reaches over each edge into the next tile (the halo rows a walk reads first, the
    keys a shifted load reads)."""
    against_conv2d(*inputs(2, 1, Tq, Tk, *kernel), tiles={"stream": (16, 16), "dw": (16, 16)}, what="16x16 tiles")


def test_heads_have_their_own_kernels():
    """One head's identity kernel passes its map through; another head's shift moves it down a row."""
    from lenx.ops.mta.conv import mta_conv

    x = torch.randn(2, 2, 9, 12, device=DEVICE)
    w = torch.zeros(2, 1, 3, 5, device=DEVICE)
    w[0, 0, 2, 2] = 1.0  # the row's own query and key
    w[1, 0, 1, 2] = 1.0  # the query above
    y = mta_conv(x, w)
    assert torch.equal(y[:, 0], x[:, 0])
    assert torch.equal(y[:, 1, 1:], x[:, 1, :-1]) and (y[:, 1, 0] == 0).all()


def test_dw_is_reproducible():
    """dw is summed from per-program partial sums in a fixed order, not by float atomics."""
    from lenx.ops.mta.conv import _weight_grad

    x, g = torch.randn(2, 2, 33, 20, device=DEVICE), torch.randn(2, 2, 33, 20, device=DEVICE)
    first, second = (_weight_grad(x, g, 3, 5, {"dw": (16, 16)}) for _ in range(2))
    assert torch.equal(first, second)


def test_bf16_maps():
    x, w = inputs(2, 2, 17, 30, 6, 11, torch.bfloat16)
    against_conv2d(x, w, 2e-2, what="bf16")  # x and dx rounded to bf16 once (~4e-3 each element)


@pytest.mark.parametrize("kernel", [(9, 11), (6, 17), (6, 10)])
def test_kernels_it_does_not_take_are_refused(kernel):
    from lenx.ops.mta.conv import mta_conv

    x, w = inputs(1, 2, 8, 8, *kernel)
    with pytest.raises(ValueError, match=r"up to 8 x 15 with c_k odd") as err:
        mta_conv(x, w)
    assert "\n" not in str(err.value)
    assert not route.fits(*kernel)


def test_other_inputs_are_refused_in_one_line():
    from lenx.ops.mta.conv import mta_conv

    for x, w, match in ((torch.randn(2, 3, 4, 4, dtype=torch.float64), torch.randn(3, 1, 2, 3), "fp16/bf16/fp32"),
                        (torch.randn(2, 3, 4, 4), torch.randn(2, 1, 2, 3), "H = 3"),
                        (torch.randn(2, 3, 4, 4), torch.randn(3, 1, 2, 3), "tiles must map")):
        with pytest.raises(ValueError, match=match) as err:
            mta_conv(x, w, {"stream": (16, 24)} if match == "tiles must map" else None)
        assert "\n" not in str(err.value)


def test_route_keeps_conv2d_off_cuda_with_documents_and_when_asked(monkeypatch):
    x, w = torch.randn(1, 2, 6, 6), torch.randn(2, 1, 3, 5)
    assert not route.uses_triton(x, w)  # a CPU tensor: F.conv2d
    assert torch.equal(route.score_conv(x, w), _conv(x, w))
    if torch.cuda.is_available():
        xc, wc = x.cuda(), w.cuda()
        assert route.uses_triton(xc, wc)
        assert not route.uses_triton(xc, wc, torch.ones(1, 6, 6, dtype=torch.bool, device="cuda"))
        assert not route.uses_triton(xc.double(), wc)
        assert not route.uses_triton(xc, torch.randn(2, 1, 9, 5, device="cuda"))
        monkeypatch.setenv("LENX_MTA_CONV", "torch")
        assert not route.uses_triton(xc, wc)
    monkeypatch.setenv("LENX_MTA_CONV", "fast")
    with pytest.raises(ValueError, match="LENX_MTA_CONV must be one of auto, torch, got 'fast'"):
        route.score_conv(x, w)


@pytest.mark.gpu
def test_gpu_125m_shape():
    """The 125m model's maps at T 512 (B 4, 12 heads, bf16, 6 x 11) against F.conv2d in float64."""
    x, w = inputs(4, 12, 512, 512, 6, 11, torch.bfloat16)
    against_conv2d(x, w, 2e-2, what="125m bf16")
    x, w = inputs(4, 12, 512, 512, 6, 11)
    against_conv2d(x, w, 1e-4, what="125m fp32")  # dw: fp32 sums of 10^6 terms a tap


@pytest.mark.gpu
def test_gpu_mta_module_routes_to_triton(monkeypatch):
    """The MTA module's convolutions run in the Triton stencil on CUDA, and equal LENX_MTA_CONV=torch's."""
    from lenx.attention.mta import MTA
    from lenx.ops.mta import conv

    calls = []
    real = conv.mta_conv
    monkeypatch.setattr(conv, "mta_conv", lambda *a: calls.append(1) or real(*a))
    mta = MTA(4, 16).cuda()
    with torch.no_grad():
        for p in mta.parameters():
            p.add_(0.1 * torch.randn_like(p))
    scores = torch.randn(2, 4, 40, 40, device="cuda", requires_grad=True)
    got = mta(scores)
    assert len(calls) == 1
    monkeypatch.setenv("LENX_MTA_CONV", "torch")
    want = mta(scores)
    assert len(calls) == 1
    assert_close(got, want, 1e-5)


CARRIES = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from lenx.ops.mta import conv

def carried(fn, sig, consts):
    src = ASTSource(fn, dict(sig, **{k: "constexpr" for k in consts}), constexprs=consts)
    ttir = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ttir"]
    return next(line for line in ttir.splitlines() if "scf.for" in line).split("->")[-1].count("tensor<")

cq = int(sys.argv[1])
maps = {"x_ptr": "*bf16", "w_ptr": "*fp32", "y_ptr": "*bf16", "H": "i32", "Tq": "i32", "Tk": "i32"}
print(carried(conv._stream, maps, {"CQ": cq, "CK": 11, "BM": 64, "BN": 128, "DIR": 1}))
maps = {"x_ptr": "*bf16", "g_ptr": "*bf16", "dw_ptr": "*fp32", "Tq": "i32", "Tk": "i32"}
print(carried(conv._dw, maps, {"CQ": cq, "CK": 11, "CKP": 16, "BM": 64, "BN": 128}))
"""


@pytest.mark.parametrize("c_q", [6, 8])
def test_compiled_walks_carry_every_register_row(c_q):
    """The compiled loops carry c_q - 1 output rows (_stream: the last starts each row at zero) and
    c_q products plus c_q - 1 rows of g (_dw) from one row to the next. Triton carries a variable
    only where its value changes, so rows that start as one zeros tensor were once dropped; the
    interpreter cannot show that. Compiled for sm_90 without a GPU, in a process of its own (no
    interpreter)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run([sys.executable, "-c", CARRIES, str(c_q)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    stream, dw = (int(n) for n in out.stdout.split())
    assert stream == c_q - 1 and dw == 2 * c_q - 1, (stream, dw)
