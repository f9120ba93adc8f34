"""model.window through the real CLI, as a user runs it: a windowed run trains, records its window and
generates; a negative window, or a window with the fused kernels forced, is one `error:` line before
any work."""

import tomllib

import pytest

from test_cli_errors import lenx, snapshot


@pytest.mark.parametrize("overrides,says", [
    (["model.window=-1"], "model.window must be >= 0"),
    (["model.layers=fox:w8,rope"], "a window on fox is not supported yet"),
])
def test_a_bad_window_is_one_error_line(tmp_path, overrides, says):
    before = snapshot(tmp_path)
    sets = [a for o in overrides for a in ("--set", o)]
    out = lenx("train", "-c", "tiny", *sets, "-o", "run", "--no-progress", cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], out.stderr
    assert snapshot(tmp_path) == before


def test_a_windowed_run_trains_and_generates(tmp_path):
    out = lenx("train", "-c", "tiny", "--set", "model.window=8", "--set", "model.method=dapev2-kerple",
               "--set", "train.steps=2", "-o", "run", "--no-progress", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert tomllib.loads((tmp_path / "run" / "config.toml").read_text())["model"]["window"] == 8
    out = lenx("generate", "run", "--prompt", "12 7 43 5", "--max-new-tokens", "20", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    tokens = out.stdout.split()
    assert 1 <= len(tokens) <= 20 and all(0 <= int(t) < 256 for t in tokens), out.stdout
