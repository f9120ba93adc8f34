"""lenx.ops.kept: the Store the fused kernels keep host-side values in (bands, DAPE V2's tables). A
value is returned for the same sources unchanged; an in-place update, another tensor at a freed
one's address, a freed owner, an inference tensor or any optimizer step (a fused AdamW's, which
leaves _version alone, too) ends it; the least recently used go first over the bounds, bytes counted
when bounding."""

import gc

import torch

from lenx.ops import kept


class Owner:
    pass


def test_same_sources_same_value_and_in_place_updates_end_it():
    store = kept.Store(8, 1 << 20, lambda v: 0)
    w = torch.randn(3)
    store.put("k", [w], "v")
    assert store.get("k", [w]) == "v" and store.get("other", [w]) is None
    w.add_(1.0)
    assert store.get("k", [w]) is None
    assert store.get("k", [torch.randn(3)]) is None  # another tensor: another stamp


def test_a_new_tensor_is_not_mistaken_for_a_freed_one():
    """An entry holds weak references: a source that is gone (its address and version may come
    back on a new tensor) never matches."""
    store = kept.Store(8, 1 << 20, lambda v: 0)
    w = torch.randn(3)
    store.put("k", [w], "v")
    stamp, refs, owner, value = store._entries["k"]
    store._entries["k"] = (stamp, [lambda: None], owner, value)  # as if w had been freed, its slot reused
    assert store.get("k", [w]) is None


def test_an_entry_goes_with_its_owner():
    store = kept.Store(8, 1 << 20, lambda v: 0)
    w, owner = torch.randn(3), Owner()
    store.put(("k", id(owner)), [w], "v", owner)
    assert store.get(("k", id(owner)), [w], owner) == "v" and store.get(("k", id(owner)), [w], Owner()) is None
    del owner
    gc.collect()
    assert len(store) == 0


def test_inference_tensors_are_never_kept():
    store = kept.Store(8, 1 << 20, lambda v: 0)
    with torch.inference_mode():
        w = torch.randn(3)
    store.put("k", [w], "v")
    assert len(store) == 0 and store.get("k", [w]) is None


def test_every_optimizer_step_empties_every_store():
    stores = [kept.Store(8, 1 << 20, lambda v: 0) for _ in range(2)]
    p = torch.nn.Parameter(torch.randn(3))
    for store in stores:
        store.put("k", [p], "v")
    p.grad = torch.ones(3)
    version = p._version
    torch.optim.AdamW([p], fused=True).step()
    assert p._version == version  # why the hook is needed: the stamp alone would still match
    assert [len(s) for s in stores] == [0, 0]


def test_bounded_by_entries_and_by_bytes_counted_when_bounding():
    store = kept.Store(3, 1 << 20, lambda v: 0)
    w = torch.randn(2)
    for i in range(5):
        store.put(i, [w], i)
    assert list(store._entries) == [2, 3, 4]
    store.get(2, [w])  # used: now the newest
    store.put(5, [w], 5)
    assert list(store._entries) == [4, 2, 5]
    sizes = {"a": 16, "b": 16, "c": 0}
    store = kept.Store(8, 40, lambda v: sizes[v])
    store.put("a", [w], "a")
    store.put("b", [w], "b")
    sizes["a"] = 30  # a value that grew (the bands' transposed band)
    store.put("c", [w], "c")
    assert list(store._entries) == ["b", "c"]  # 46 bytes now: counted at put time, a would have stayed
