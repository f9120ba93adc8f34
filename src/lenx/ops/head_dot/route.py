"""Which code takes the per-head dot product: triton.py's kernel where it applies (CUDA tensors, or
any under Triton's interpreter, as the CPU tests run it; fp16, bf16 or fp32 of one dtype; triton
importable; not under torch.compile), else reference.head_dot (float64 inputs, the CPU without the
interpreter). Plain torch here: triton.py is imported only when it runs."""

import importlib.util
import os

import torch

from . import reference

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def uses_triton(x: torch.Tensor, y: torch.Tensor) -> bool:
    # is_compiling first: under torch.compile (inductor fuses the product and the sum) nothing after it is traced
    return (not torch.compiler.is_compiling() and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")
            and x.dtype in DTYPES and y.dtype == x.dtype and importlib.util.find_spec("triton") is not None)


def head_dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """reference.head_dot(x, y) ([H], fp32; float64 for float64 inputs), by the kernel where
    uses_triton says so (its products in fp32, not rounded to the inputs' dtype)."""
    if uses_triton(x, y):
        from .triton import head_dot as kernel

        return kernel(x, y)
    return reference.head_dot(x, y)
