"""lenx.ops.dape_v2.tables: the host-table cache of forward-only DAPE V2 work. A value is reused for
the same source tensors and key, rebuilt after an in-place update or an optimizer step (a fused one
too), never kept for work that needs a gradient, and the cache stays bounded (lenx.ops.kept's own
tests: tests/ops/test_kept.py)."""

import torch

from lenx.ops.dape_v2 import tables


class Counter:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return torch.full((4,), float(self.calls))


def setup_function():
    tables.clear()


def test_reused_for_the_same_sources_and_key():
    w = torch.nn.Parameter(torch.randn(3, 2))
    build = Counter()
    with torch.no_grad():
        first = tables.cached([w], ("k", 8), build)
        again = tables.cached([w], ("k", 8), build)
        other_t = tables.cached([w], ("k", 16), build)
    assert build.calls == 2 and again is first and other_t is not first
    assert tables.size() == 2


def test_an_optimizer_step_invalidates_it():
    w = torch.nn.Parameter(torch.randn(3, 2))
    build = Counter()
    with torch.no_grad():
        tables.cached([w], "k", build)
    w.grad = torch.ones_like(w)
    torch.optim.AdamW([w], lr=0.1, fused=True).step()  # leaves w._version alone: the Store forgets
    with torch.no_grad():
        tables.cached([w], "k", build)
        tables.cached([w], "k", build)
    assert build.calls == 2
    with torch.no_grad():
        w.mul_(2)  # any in-place change
        tables.cached([w], "k", build)
    assert build.calls == 3


def test_work_that_needs_a_gradient_never_uses_it():
    w = torch.nn.Parameter(torch.randn(3, 2))
    build = Counter()
    for _ in range(3):
        tables.cached([w], "k", build)  # grad enabled and w requires it: built inside the graph
    assert build.calls == 3 and tables.size() == 0
    with torch.no_grad():
        tables.cached([w], "k", build)
    tables.cached([w], "k", build)  # the entry exists, but training must not read it
    assert build.calls == 5


def test_bounded_by_entries(monkeypatch):
    monkeypatch.setattr(tables._store, "max_entries", 3)
    w = torch.randn(2)
    build = Counter()
    for T in range(5):
        tables.cached([w], T, build)
    assert tables.size() == 3
    tables.cached([w], 4, build)  # the newest stayed
    assert build.calls == 5
    tables.cached([w], 0, build)  # the oldest went
    assert build.calls == 6


def test_a_changed_source_replaces_its_entry():
    """One entry per key and sources: the tables of a weight's earlier values are not kept."""
    w = torch.nn.Parameter(torch.randn(3, 2))
    build = Counter()
    with torch.no_grad():
        for _ in range(3):
            tables.cached([w], "k", build)
            w.add_(1.0)
    assert build.calls == 3 and tables.size() == 1
