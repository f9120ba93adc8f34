"""What the kernel and the training-step benchmarks share."""

import torch


def is_oom(err: Exception) -> bool:
    """Whether err is an out-of-memory (or, from Triton, out-of-resources) error: a result, not a failure."""
    text = f"{type(err).__name__}: {err}".lower()
    return isinstance(err, torch.cuda.OutOfMemoryError) or any(
        s in text for s in ("out of memory", "outofresources", "out of resource"))
