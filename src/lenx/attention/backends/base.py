"""The interface every backend implements, and what a backend declares about its memory."""

from dataclasses import dataclass

import torch

from ..parts import Parts


@dataclass(frozen=True)
class Work:
    """One attention layer's work, as a memory estimate sees it: `batch` sequences of `length`
    tokens, `heads` heads of `head_dim`, `itemsize` bytes per element of q, k, v (2 under bf16
    autocast), `chunk_size` query rows per block (model.chunk_size), `training`: its backward runs."""
    batch: int
    heads: int
    length: int
    head_dim: int
    itemsize: int = 4
    chunk_size: int = 256
    training: bool = True


@dataclass(frozen=True)
class LayerMemory:
    """Bytes an attention layer takes beyond its q, k, v and output: `kept` from its forward to its
    backward (every layer holds its own until the backward reaches it), `peak` while it computes
    (its forward or its backward; one layer at a time)."""
    kept: int
    peak: int


class Backend:
    """One way to compute an attention composition. `unsupported` says why it cannot run `parts` on
    `device` (None: it can), `run` computes (out [B, H, T, d], rem [B, H, T] or None) from q, k, v
    [B, H, T, d] (q and k already rotated) and the document ids segments [B, T] (None: one
    document; parts.segments says whether they come, parts.window the window: masks.py). `auto`: the planner may pick it without being asked; `trains`: it has a backward there."""

    name: str = ""

    def unsupported(self, parts: Parts, device: torch.device) -> str | None:
        return None

    def auto(self, device: torch.device) -> bool:
        return True

    def trains(self, device: torch.device) -> bool:
        """Whether it has a backward on `device` (it may still run forward only there)."""
        return True

    def describe(self, parts: Parts) -> str | None:
        """Which kernels it picks among for `parts` when that depends on the work (for `lenx list`)."""
        return None

    def memory(self, parts: Parts, work: Work) -> LayerMemory:
        """The memory of `work` on this backend. This default is a fused kernel's, O(T): the
        log-sum-exp of every row kept for the backward, and its gradient buffers while it computes."""
        rows = work.batch * work.heads * work.length
        return LayerMemory(kept=rows * 4 if work.training else 0, peak=2 * rows * 4)

    def folds_q_scale(self, parts: Parts) -> bool:
        """Whether run() takes a query temperature's factor per row (q_scale) into its kernels, so that
        q comes unscaled and no pass of its own scales it; none but the fused one's by default."""
        return False

    def run(self, q, k, v, parts: Parts, chunk_size: int = 256, segments=None):
        raise NotImplementedError
