"""Which code runs MTA's query-key convolution: conv.py's Triton stencil where it applies (a CUDA
tensor of fp16/bf16/fp32, triton importable, not under torch.compile, no document ids, a kernel of
at most 8 x 15), else reference._conv's F.conv2d. LENX_MTA_CONV=torch keeps F.conv2d everywhere
(for A/B timing); the default is auto. Plain torch here: conv.py is imported only when it runs."""

import importlib.util
import os

import torch

from .reference import _conv

MODES = ("auto", "torch")
MAX_KERNEL = (8, 15)  # the largest (c_q, c_k) the Triton kernels take: they unroll every tap


def fits(c_q: int, c_k: int) -> bool:
    return c_q <= MAX_KERNEL[0] and c_k <= MAX_KERNEL[1] and c_k % 2 == 1


def mode() -> str:
    value = os.environ.get("LENX_MTA_CONV", "auto")
    if value not in MODES:
        raise ValueError(f"LENX_MTA_CONV must be one of {', '.join(MODES)}, got {value!r}")
    return value


def uses_triton(x: torch.Tensor, kernel: torch.Tensor, documents=None) -> bool:
    # is_compiling first: under torch.compile (inductor convolves) nothing after it is traced
    return (not torch.compiler.is_compiling() and mode() == "auto" and x.is_cuda and documents is None
            and x.dtype in (torch.float16, torch.bfloat16, torch.float32) and fits(*kernel.shape[-2:])
            and importlib.util.find_spec("triton") is not None)


def score_conv(x: torch.Tensor, kernel: torch.Tensor, documents=None) -> torch.Tensor:
    """reference._conv(x, kernel, documents), by the Triton stencil where uses_triton says so."""
    if uses_triton(x, kernel, documents):
        from .conv import mta_conv

        return mta_conv(x, kernel)
    return _conv(x, kernel, documents)
