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
