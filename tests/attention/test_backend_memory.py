"""What each backend declares about its memory (Backend.memory), which lenx.model.memory adds up
before a run starts: the dense reference grows as T^2, the chunked one as one block of rows, SDPA
and the fused kernels as T; the reference paths' score maps are measured on the composition."""

import pytest
import torch

from lenx.attention import Attention
from lenx.attention.backends import Work, get_backend, score_maps
from lenx.attention.methods import all_methods
from lenx.config import AttentionConfig


def parts_of(method: str, causal: bool = True):
    return Attention(AttentionConfig(method=method, causal=causal), 4, 64).parts


@pytest.mark.parametrize("method", all_methods())
def test_every_composition_has_its_score_maps_measured(method):
    maps = score_maps(parts_of(method), Work(batch=8, heads=4, length=1024, head_dim=16))
    assert 0.9 < maps < 60, maps  # softmax keeps one map, a DAPE processor about 20


def test_score_maps_by_part():
    work = Work(batch=8, heads=4, length=1024, head_dim=16)
    plain, dape = score_maps(parts_of("rope"), work), score_maps(parts_of("dapev2-kerple"), work)
    assert 0.9 < plain < 1.3  # the softmax's probabilities (and the mask, once for the batch)
    assert dape > 15  # [S; bias] before and after the tril, the hidden channels, the convolution's outputs
    assert score_maps(parts_of("dapev2-kerple", causal=False), work) > 15


def test_the_probe_leaves_the_random_state_alone():
    parts = parts_of("fire")
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    score_maps(parts, Work(batch=2, heads=4, length=64, head_dim=16))
    assert torch.equal(torch.rand(4), expected)


@pytest.mark.parametrize("training", [True, False])
def test_how_each_backend_grows_with_the_length(training):
    parts = parts_of("alibi")
    work = lambda T: Work(batch=4, heads=4, length=T, head_dim=16, chunk_size=128, training=training)  # noqa: E731
    dense = [get_backend("dense").memory(parts, work(T)) for T in (1024, 2048)]
    chunked = [get_backend("chunked").memory(parts, work(T)) for T in (1024, 2048)]
    fused = [get_backend("triton").memory(parts, work(T)) for T in (1024, 2048)]
    assert dense[1].peak / dense[0].peak == pytest.approx(4, rel=0.01)  # a [B, H, T, T] map
    assert chunked[1].peak / chunked[0].peak == pytest.approx(2, rel=0.01)  # [B, H, chunk, T]
    assert fused[1].peak / fused[0].peak == pytest.approx(2, rel=0.01)  # O(T)
    assert chunked[0].kept == 0  # its blocks are recomputed in the backward
    if training:
        assert dense[1].kept / dense[0].kept == pytest.approx(4, rel=0.01)  # every layer keeps its maps
        assert fused[0].kept > 0
    else:
        assert dense[0].kept == fused[0].kept == 0
    # at 1024 keys the dense map is 8 blocks of 128 rows; a chunked backward holds ~3 sets of one block
    assert dense[0].peak > 3 * chunked[0].peak
