"""The attention maps of a windowed run show only what each row sees: NaN past the diagonal and left
of the window."""

import torch

from lenx.evaluation.attention_maps import attention_maps


def test_the_maps_of_a_windowed_run(tmp_path):
    from lenx.config import load_config
    from lenx.training.loop import train

    cfg = load_config("tiny", ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=16",
                               "train.batch_size=2", "train.steps=1", "model.method=dapev2-kerple", "model.window=3",
                               f"data.root={str(tmp_path / 'data')!r}"])
    train(cfg, tmp_path / "run", progress=False)
    maps = attention_maps(tmp_path / "run", torch.arange(10) % 7, layer=0, head=1)
    i, j = torch.meshgrid(torch.arange(10), torch.arange(10), indexing="ij")
    seen = (j <= i) & (i - j < 3)
    for name in ("scores", "bias", "processed"):
        assert torch.equal(maps[name].isnan(), ~seen), name
