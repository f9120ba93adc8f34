"""lenx.ops.dape_v2.tables: the host-table cache of forward-only DAPE V2 work. A value is reused for
the same source tensors and key, rebuilt after an in-place update (an optimizer step), never kept
for work that needs a gradient, and the cache stays bounded."""

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
    torch.optim.SGD([w], lr=0.1).step()  # in place: bumps w._version
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


def test_a_new_tensor_is_not_mistaken_for_a_freed_one():
    """An entry holds weak references: a source that is gone (its address and version may come
    back on a new tensor) never matches."""
    build = Counter()
    w = torch.randn(3, 2)
    tables.cached([w], "k", build)
    key = next(iter(tables._entries))
    refs, value, nbytes = tables._entries[key]
    tables._entries[key] = ([lambda: None], value, nbytes)  # as if w had been freed and its slot reused
    tables.cached([w], "k", build)
    assert build.calls == 2


def test_bounded_by_entries_and_bytes(monkeypatch):
    monkeypatch.setattr(tables, "MAX_ENTRIES", 3)
    w = torch.randn(2)
    build = Counter()
    for T in range(5):
        tables.cached([w], T, build)
    assert tables.size() == 3
    tables.cached([w], 4, build)  # the newest stayed
    assert build.calls == 5
    tables.cached([w], 0, build)  # the oldest went
    assert build.calls == 6
    monkeypatch.setattr(tables, "MAX_BYTES", 40)  # two values of 16 bytes fit, three do not
    tables.clear()
    for T in range(3):
        tables.cached([w], T, build)
    assert tables.size() == 2
