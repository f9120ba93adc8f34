"""Reading many sequences in batches that shrink on CUDA out-of-memory (lenx's own models and
transformers models alike)."""

import torch


def halving_batches(n: int, batch: int, read):
    """read(start, stop) over 0..n in batches of up to `batch` items; on CUDA out-of-memory the
    batch halves and the same slice is retried (one item that does not fit raises). Yields
    (start, stop, what read returned)."""
    i = 0
    while i < n:
        stop = min(i + batch, n)
        try:
            part = read(i, stop)
        except torch.OutOfMemoryError:
            if batch == 1:
                raise
            torch.cuda.empty_cache()
            batch //= 2
            continue
        yield i, stop, part
        i = stop
