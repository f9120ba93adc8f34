"""The interface every backend implements."""

import torch

from ..parts import Parts


class Backend:
    """One way to compute an attention composition. `unsupported` says why it cannot run `parts` on
    `device` (None: it can), `run` computes (out [B, H, T, d], rem [B, H, T] or None) from q, k, v
    [B, H, T, d] (q and k already rotated). `auto`: the planner may pick it without being asked; `trains`: it has a backward there."""

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

    def run(self, q, k, v, parts: Parts, chunk_size: int = 256):
        raise NotImplementedError
