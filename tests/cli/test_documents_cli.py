"""train.documents=masked through the real CLI, as a user runs it (relative paths, another working
directory): a masked run trains, records the choice and resumes to the same losses (MTA with a window trains
too); an unknown value or a corpus with no document boundaries is one `error:` line before any work."""

import json
import tomllib

import pytest

from lenx.data.build import prepare_corpus
from test_cli_errors import lenx, snapshot

TINY = ["-c", "tiny", "--set", "train.documents=masked", "--set", "model.method=dapev2-kerple",
        "--set", "train.steps=4", "--set", "train.ckpt_every=2", "--set", "train.log_every=1", "--no-progress"]


def losses(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


def test_a_masked_run_trains_records_its_choice_and_resumes_to_the_same_losses(tmp_path):
    out = lenx("train", *TINY, "-o", "whole", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    meta = json.loads((tmp_path / "whole" / "meta.json").read_text())
    assert meta["documents"] == "masked"
    assert tomllib.loads((tmp_path / "whole" / "config.toml").read_text())["train"]["documents"] == "masked"
    out = lenx("train", *TINY, "-o", "parts", "--until", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    out = lenx("train", "--resume", "parts", "--no-progress", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    whole, parts = losses(tmp_path / "whole"), losses(tmp_path / "parts")
    assert sorted(whole) == sorted(parts) == [1, 2, 3, 4]
    for step in whole:  # the same windows and document ids after the resume
        assert parts[step] == pytest.approx(whole[step], rel=1e-5, abs=1e-6), step


def test_mta_with_a_window_trains_document_masked(tmp_path):
    out = lenx("train", "-c", "tiny", "--set", "train.documents=masked", "--set", "model.method=mta",
               "--set", "model.window=8", "--set", "train.steps=2", "--set", "train.log_every=1", "-o", "run",
               "--no-progress", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["documents"] == "masked"
    assert len(losses(tmp_path / "run")) == 2


@pytest.mark.parametrize("overrides,says", [
    (["train.documents=packed"], "train.documents must be one of stream, masked"),
    (["data.corpus=one", "train.documents=masked"], "split of corpus 'one' is 1 document (no boundaries)"),
])
def test_a_bad_documents_setting_is_one_error_line(tmp_path, overrides, says):
    texts = tmp_path / "texts"
    texts.mkdir()
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta"]
    for i, n in enumerate([3000, 40, 40]):  # distinct documents (near-duplicates would be dropped)
        (texts / f"d{i}.txt").write_text(" ".join(words[(j * (i + 2) + j // 7) % 6] for j in range(n)))
    prepare_corpus("one", tmp_path / "data", from_path=texts, vocab_size=300, val_frac=0.34, test_frac=0.33,
                   progress=False)
    before = snapshot(tmp_path)
    sets = [a for o in overrides for a in ("--set", o)]
    out = lenx("train", "-c", "tiny", *sets, "-o", "run", "--no-progress", cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], out.stderr
    assert snapshot(tmp_path) == before
