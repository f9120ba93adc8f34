"""How much memory DAPE V2's skewed training kernels (lenx.ops.dape_v2.skewed) take in a step.

A layer's skewed work either keeps its S and F buffers from the forward to the backward ("keep":
the fastest) or recomputes them in the backward ("recompute": the same kernels once more), and a
recomputing layer may run its batch in slices, one slice's buffers at a time, so that its working
set shrinks with the slice. The buffers (skewed.buffer_bytes) are the packed causal triangles of
T x T maps: at the 125m shapes a kept layer holds 0.24 GB at 512 x 32 and 0.94 GB at 2048 x 8,
twelve layers of it most of what the step's peak holds beyond Kerple's.

LENX_DAPE_V2_MEMORY sets a budget in GiB for all of it at once: the buffers every layer of the
graph keeps plus one layer's working set. A layer's forward keeps where the kept buffers of the
layers before it, its own and its working set fit the budget; else it recomputes, in the largest
batch slice whose working set fits beside what is kept; where no slice fits, the O(T)-memory Triton
kernel (no T x T buffers) runs it. The kept bytes are counted from a layer's forward until its
backward has run or its graph is freed, so a budget holds for the whole step, backward included,
and across gradient-accumulation micro-batches. Unset or "auto": keep where the device has room for
the whole working set beside the kept buffers, recompute where only the working set fits (sliced
where the whole batch's does not), decided from the device's free memory at each layer's forward.
"""

import math
import os
import weakref

BUDGET_ENV = "LENX_DAPE_V2_MEMORY"
GIB = 1 << 30


def budget_bytes() -> int | None:
    """LENX_DAPE_V2_MEMORY in bytes; None for "auto" (or unset). A value that is not a number of GiB
    >= 0 is a ValueError of one line."""
    value = os.environ.get(BUDGET_ENV, "auto").strip()
    if value in ("", "auto"):
        return None
    try:
        gib = float(value)
    except ValueError:
        gib = -1.0
    if not math.isfinite(gib) or gib < 0:
        raise ValueError(f"{BUDGET_ENV} must be 'auto' or a number of GiB >= 0 (the most DAPE V2's T x T buffers "
                         f"may hold at once in a step), got {value!r}")
    return int(gib * GIB)


def plan(batch: int, keep_bytes: int, work_bytes: int, kept: int, free: int, budget: int | None):
    """(mode, slice): "keep" or "recompute" with the batch slice to run at once, or (None, 0) where
    no slice fits (the O(T)-memory kernel's work). keep_bytes and work_bytes are the whole batch's
    (the buffers a keeping layer holds to its backward; a layer's peak beyond them), both in
    proportion to the batch; kept: what earlier layers of the graph keep now; free: the device's free
    memory; budget: budget_bytes() (None: the device's free memory decides alone)."""
    room = free if budget is None else min(free, budget - kept)
    if keep_bytes + work_bytes <= room:
        return "keep", batch
    for size in range(batch, 0, -1):
        if work_bytes * size <= room * batch:  # work_bytes * size / batch without rounding
            return "recompute", size
    return None, 0


class KeptBytes:
    """The bytes the skewed kernels' autograd nodes keep now, each counted from its forward until the
    node's backward has run or the node is freed (whichever comes first)."""

    def __init__(self):
        self.total = 0

    def add(self, node, nbytes: int) -> None:
        """Counts nbytes for `node`, a custom autograd Function's node (weakly referenceable)."""
        done = [False]

        def release(*_):
            if not done[0]:
                done[0] = True
                self.total -= nbytes
        self.total += nbytes
        node.register_hook(release)
        weakref.finalize(node, release)


KEPT = KeptBytes()
