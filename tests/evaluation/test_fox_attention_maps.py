"""The attention maps of a FoX run (`lenx plot --attention`'s data): its bias is read from the layer's
input, so the maps bind it as the forward does; the map is a forget bias, sum_{l=j+1..i} log f_l:
zero on the diagonal, at most zero below it, and additive along any path (b_ij = b_ik + b_kj)."""

import torch

from lenx.config import load_config
from lenx.evaluation.attention_maps import attention_maps, map_names
from lenx.training.loop import train


def test_the_maps_of_a_fox_run(tmp_path):
    cfg = load_config("tiny", ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=16",
                               "train.batch_size=2", "train.steps=1", "model.method=dapev2-fox",
                               f"data.root={str(tmp_path / 'data')!r}"])
    train(cfg, tmp_path / "run", progress=False)
    maps = attention_maps(tmp_path / "run", torch.arange(12) % 7, layer=0, head=1)
    assert map_names("dapev2-fox") == ["scores", "bias", "processed"]
    assert set(maps) == {"scores", "bias", "processed", "method", "layer", "head", "length"}
    bias = maps["bias"].double()
    assert torch.equal(bias.diagonal(), torch.zeros(12, dtype=torch.float64))
    below = torch.ones(12, 12, dtype=torch.bool).tril(-1)
    assert (bias[below] < 0).all()
    for i, k, j in ((11, 5, 0), (9, 4, 2), (7, 6, 3)):
        assert abs(bias[i, j] - (bias[i, k] + bias[k, j])) < 1e-5
