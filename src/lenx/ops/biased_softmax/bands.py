"""The bands of one bias table (band.build_band), and a cache that keeps them between calls whose
table has not changed.

A call of the fused Kerple kernels with a short window does little GPU work, and the host work of
building its table (about ten small ops from the two parameters) and its bands (one launch in the
forward, one for the transposed band in the backward) is then a fixed cost a call. Where the table
gets no gradient through the kernels (Kerple, whose parameters get theirs from the kernel directly;
a bias with nothing to train, ALiBi), its bands depend only on the values of the tensors it is built
from, so `cached_bands` keeps them per (bias, T, band dtype, device) in a lenx.ops.kept Store, which
says when they are still valid (the tensors they were built from unchanged) and empties itself after
every optimizer step.

One slot per (bias, T, band dtype, device): a changed tensor replaces its slot's bands, so a
training run holds one set per layer and length, never a history of them; a bias freed takes its
slots with it. `clear()` drops every slot; `stats` counts builds and hits (for the tests).
"""

import torch

from ..kept import Store
from .band import build_band

MAX_ENTRIES = 48        # 12 layers x 4 lengths
MAX_BYTES = 1 << 30     # a band and its transpose: ~26 MB at H 12, T 8192 (fp16)

stats = {"builds": 0, "hits": 0}


class Bands:
    """The bands of one [H, 2T - 1] table (values only: no gradient flows through them): the
    forward's (band, off) at once, the key-owner kernel's transposed band when a backward first
    asks for it (transposed()), then kept with them."""

    def __init__(self, table: torch.Tensor, T: int, res16: bool):
        self.table = table.detach()
        self.T, self.H, self.res16 = T, table.shape[0], res16
        self.band, self.off = build_band(self.table, T, res16)
        self._trans = None

    def transposed(self) -> torch.Tensor:
        if self._trans is None:
            self._trans = build_band(self.table, self.T, self.res16, trans=True)[0]
        return self._trans

    def nbytes(self) -> int:
        """Bytes held once the transposed band is built too (off shares band's storage in fp32)."""
        band = self.band.numel() * self.band.element_size()
        return 2 * band + (self.off.numel() * 4 if self.res16 else 0) + self.table.numel() * 4


_store = Store(MAX_ENTRIES, MAX_BYTES, Bands.nbytes)


def cached_bands(owner, sources, table_fn, T: int, res16: bool, device) -> Bands:
    """The Bands of table_fn() (a [H, 2T - 1] table of the bias `owner`, read from `sources`, the
    leaf tensors it is built from), kept from an earlier call of the same owner with its sources
    unchanged. table_fn runs under no_grad: the bands carry no gradient (the caller's bias gets its
    gradient another way, or has none)."""
    sources = [t for t in sources if t is not None]
    key = (id(owner), T, res16, torch.device(device))
    bands = _store.get(key, sources, owner)
    # bands built under inference_mode cannot be saved for a backward: outside it they are rebuilt
    if bands is not None and (torch.is_inference_mode_enabled() or not bands.band.is_inference()):
        stats["hits"] += 1
        return bands
    with torch.no_grad():
        bands = Bands(table_fn(), T, res16)
    stats["builds"] += 1
    _store.put(key, sources, bands, owner)
    return bands


def clear():
    _store.clear()


def size() -> int:
    return len(_store)
