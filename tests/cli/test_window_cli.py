"""model.window through the real CLI, as a user runs it: a windowed run trains, records its window and
generates (FoX and MTA too; a FoX run exports); a negative window, or a window with the fused kernels
forced, is one `error:` line before any work."""

import importlib.util
import tomllib

import pytest

from test_cli_errors import lenx, snapshot


@pytest.mark.parametrize("overrides,says", [
    (["model.window=-1"], "model.window must be >= 0"),
])
def test_a_bad_window_is_one_error_line(tmp_path, overrides, says):
    before = snapshot(tmp_path)
    sets = [a for o in overrides for a in ("--set", o)]
    out = lenx("train", "-c", "tiny", *sets, "-o", "run", "--no-progress", cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], out.stderr
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("method,extra", [("dapev2-kerple", []), ("fox", ["model.fox_kv_shift=true"]), ("mta", [])])
def test_a_windowed_run_trains_and_generates(tmp_path, method, extra):
    sets = [a for o in extra for a in ("--set", o)]
    out = lenx("train", "-c", "tiny", "--set", "model.window=8", "--set", f"model.method={method}", *sets,
               "--set", "train.steps=2", "-o", "run", "--no-progress", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert tomllib.loads((tmp_path / "run" / "config.toml").read_text())["model"]["window"] == 8
    out = lenx("generate", "run", "--prompt", "12 7 43 5", "--max-new-tokens", "20", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    tokens = out.stdout.split()
    assert 1 <= len(tokens) <= 20 and all(0 <= int(t) < 256 for t in tokens), out.stdout
    if method == "fox" and importlib.util.find_spec("transformers"):  # the export checks its logits against the run's
        out = lenx("export", "run", "hf", cwd=tmp_path)
        assert out.returncode == 0 and out.stdout.startswith("wrote hf: fox"), out.stderr[-2000:]
