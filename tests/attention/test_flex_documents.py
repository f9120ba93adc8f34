"""FlexAttention with document ids, as training calls it (new ids every step, the same ids in every
layer of a step): the compiled kernel compiles once, the block mask is built once per ids tensor.
On the CPU, with a counting torch.compile backend in place of inductor (same dynamo guards)."""

import pytest
import torch

from helpers import assert_close
from lenx.attention import Attention, AttentionConfig
from lenx.attention.backends import flex as flex_module
from lenx.attention.backends import run_backend
from lenx.bench.common import packed_document_ids

pytest.importorskip("torch.nn.attention.flex_attention")
B, H, T, D = 2, 2, 40, 16


def parts_of(method, window=0):
    from dataclasses import replace

    parts = Attention(AttentionConfig(method=method, backend="dense", window=window), H, H * D).parts
    return replace(parts, segments=True)


def qkv(seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=gen) for _ in range(3)]


class Counting:
    """A torch.compile backend that counts the graphs dynamo hands it (each compilation) and runs them."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


@pytest.mark.parametrize("method,window", [("nope", 0), ("kerple", 0), ("nope", 9)])
def test_new_document_ids_compile_nothing_new(method, window):
    counter = Counting()
    flex = flex_module.Flex(compiler=counter, compiled_on=("cpu",))
    parts = parts_of(method, window)
    with torch.no_grad():
        for step in range(3):  # each step its own ids, as training draws them
            ids = packed_document_ids(B, T, 3 + step, draw=step)
            q, k, v = qkv(step)
            out, _ = flex.run(q, k, v, parts, segments=ids)
            ref, _ = run_backend("dense", q, k, v, parts, segments=ids)
            assert_close(out, ref, 1e-5, f"step {step}")
    assert counter.graphs == 1


def test_the_block_mask_is_built_once_per_ids_tensor(monkeypatch):
    builds = []
    build = flex_module._block_mask
    monkeypatch.setattr(flex_module, "_block_mask", lambda *args: builds.append(1) or build(*args))
    flex, parts = flex_module.Flex(), parts_of("nope")
    q, k, v = qkv(0)
    ids = packed_document_ids(B, T, 4)

    def check(what):
        with torch.no_grad():
            out, _ = flex.run(q, k, v, parts, segments=ids)
            ref, _ = run_backend("dense", q, k, v, parts, segments=ids)
        assert_close(out, ref, 1e-5, what)

    for layer in range(3):  # the layers of one step share their ids: one build
        check(f"layer {layer}")
    assert len(builds) == 1
    ids = packed_document_ids(B, T, 4)  # equal ids, but a new tensor (the next step's): built again
    check("new tensor")
    assert len(builds) == 2
    ids[:, T // 2:] += 1  # changed in place: the kept mask would be wrong, so it is built again
    check("changed in place")
    assert len(builds) == 3
    windowed, plain = parts_of("nope", window=5), parts
    for layer in range(3):  # a layout's layers alternating two windows keep a mask each
        parts = windowed if layer % 2 else plain
        check(f"layout layer {layer}")
    assert len(builds) == 4


def tiles(num, indices):
    """A BlockMask's (count, indices) pair -> its tiles [B, n, n] as booleans."""
    n = indices.shape[-1]
    dense = torch.zeros(*indices.shape[:-1], n + 1, dtype=torch.bool)
    cols = torch.where(torch.arange(n) < num[..., None].long(), indices.long(), n)  # unused slots to a spare column
    dense.scatter_(-1, cols, True)
    return dense[..., :n][:, 0]


@pytest.mark.parametrize("T,window,docs,block", [
    (1, 0, 1, 16), (37, 0, 0, 16), (37, 1, 0, 16), (100, 17, 0, 16), (100, 16, 0, 16), (100, 200, 0, 16),
    (100, 60, 0, 16), (37, 0, 37, 16), (100, 0, 6, 16), (100, 23, 6, 16), (96, 8, 30, 16), (100, 0, 2, 16),
    (100, 40, 2, 16), (300, 0, 5, 128), (300, 130, 0, 128)])
def test_tiles_from_bounds_match_create_block_mask(T, window, docs, block):
    """The block mask built from the tiles' bounds and ids equals create_block_mask's (which evaluates
    every pair) wherever that one says full or (without documents) partial; with documents a tile
    can only be partial here where it is skipped there (masked inside: still exact)."""
    from torch.nn.attention.flex_attention import and_masks, create_block_mask

    ids = packed_document_ids(2, T, docs, draw=T) if docs else None
    parts = parts_of("nope", window)
    ours = flex_module._block_mask(parts, T, torch.device("cpu"), ids, block)
    rules = [lambda b, h, qi, ki: ki <= qi]
    if window:
        rules.append(lambda b, h, qi, ki: qi - ki < window)
    if ids is not None:
        rules.append(lambda b, h, qi, ki: ids[b, qi] == ids[b, ki])
    theirs = create_block_mask(and_masks(*rules), 2 if docs else None, None, T, T, device="cpu", BLOCK_SIZE=block)
    full, partial = tiles(ours.full_kv_num_blocks, ours.full_kv_indices), tiles(ours.kv_num_blocks, ours.kv_indices)
    their_full = tiles(theirs.full_kv_num_blocks, theirs.full_kv_indices)
    their_partial = tiles(theirs.kv_num_blocks, theirs.kv_indices)
    assert torch.equal(full, their_full)
    if ids is None:
        assert torch.equal(partial, their_partial)
    else:
        assert not (their_partial & ~partial).any()
        assert not (partial & ~their_partial & their_full).any()
    assert ours.seq_lengths == (T, T)
