"""MTA in CHE: its query convolution reads earlier queries only (the paper's), so the encoder runs it
causally, like stick-breaking and CoPE; `lenx che` trains and tests it and its compositions."""

import json

import torch

from lenx.che.protocol import Encoder, make_config, runs_causally


def test_lenx_che_runs_mta_causally(tmp_path):
    from typer.testing import CliRunner

    from lenx.cli import app

    out = CliRunner().invoke(app, ["che", "--tasks", "parity_check", "--methods", "mta,mta-kerple", "--steps", "2",
                                   "--test-max-length", "47", "--test-samples", "4", "--no-progress",
                                   "--out", str(tmp_path / "che")])
    assert out.exit_code == 0, out.output
    runs = json.loads((tmp_path / "che" / "che.json").read_text())["runs"]
    assert {r["method"] for r in runs} == {"mta", "mta-kerple"}
    assert runs_causally("mta") and runs_causally("mta-kerple")
    torch.manual_seed(0)
    model = Encoder("mta", 4, 2, make_config("smoke")).eval()
    assert model.blocks[-1].attn.processor.conv_kernel is not None  # the smoke encoder's 2 layers: the last convolves
    x = torch.randint(0, 3, (1, 12))
    y = x.clone()
    y[0, 5] = (y[0, 5] + 1) % 3
    with torch.no_grad():
        out_x, out_y = model(x), model(y)
    assert torch.allclose(out_x[0, :5], out_y[0, :5])
    assert not torch.allclose(out_x[0, -1], out_y[0, -1])
