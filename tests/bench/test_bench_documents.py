"""`lenx bench --documents N`: windows packed from N documents, in the train-step rows (beside the
unmasked step, in one JSON) and the kernel rows; run as a user runs it (subprocesses, relative
paths, another working directory); a bad N is one error line before any work."""

import json
import subprocess
import sys

import pytest
import torch

from lenx.attention.masks import positions
from lenx.bench.common import packed_document_ids

STEP = ["bench", "--train-step", "--device", "cpu", "--preset", "tiny", "--seq-len", "16", "--batch", "2",
        "--steps", "1", "--warmup", "0"]


def lenx(args, cwd):
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.mark.parametrize("T,n", [(16, 1), (16, 5), (16, 16), (1, 1)])
def test_packed_ids_cut_each_row_into_n_documents(T, n):
    ids = packed_document_ids(3, T, n, draw=7)
    assert ids.shape == (3, T) and ids.dtype == torch.long
    assert (ids[:, 0] == 0).all() and (ids[:, -1] == n - 1).all()
    assert ((ids[:, 1:] - ids[:, :-1]) >= 0).all()
    assert ((positions(ids) == 0).sum(-1) == n).all()  # positions restart at each of the n documents
    assert torch.equal(ids, packed_document_ids(3, T, n, draw=7))  # the same draw, the same cuts
    if 1 < n < T:
        assert not torch.equal(ids, packed_document_ids(3, T, n, draw=8))


def test_train_step_rows_packed_beside_unmasked(tmp_path):
    (tmp_path / "out").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    proc = lenx([*STEP, "--methods", "rope,kerple", "--profile-steps", "1", "--documents", "4",
                 "-o", "../out/step.json"], cwd=work)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "out" / "step.json").read_text())
    assert result["settings"]["documents"] == 4
    rows = result["rows"]
    assert [(r["method"], r["documents"]) for r in rows] == [("rope", 0), ("rope", 4), ("kerple", 0), ("kerple", 4)]
    assert all("error" not in r and r["median_ms"] > 0 and r["step_gpu_ms"] > 0 for r in rows)
    for masked, plain in ((rows[1], rows[0]), (rows[3], rows[2])):
        assert masked["wall_x_unmasked"] == pytest.approx(masked["median_ms"] / plain["median_ms"], rel=1e-9)
        assert masked["step_gpu_x_unmasked"] == pytest.approx(masked["step_gpu_ms"] / plain["step_gpu_ms"], rel=1e-9)
        assert "wall_x_unmasked" not in plain
    assert rows[3]["step_gpu_x_kerple"] == pytest.approx(1.0)  # ratios among rows of one packing
    assert "rope (4 docs)" in proc.stdout and "x unmasked" in proc.stdout


@pytest.mark.parametrize("args,words", [
    ([*STEP, "--documents", "0"], "--documents packs each window of 16 tokens from 1 to 16 documents, not 0"),
    ([*STEP, "--documents", "17"], "from 1 to 16 documents, not 17"),
    (["bench", "--documents", "3000", "--lengths", "8192,2048"], "each window of 2048 tokens from 1 to 2048"),
    (["bench", "--documents", "-1"], "documents, not -1"),
    (["bench", "--decode", "--documents", "2"], "--documents applies to the kernel rows and --train-step"),
])
def test_a_bad_document_count_is_one_error_line(tmp_path, args, words):
    proc = lenx([*args, "-o", "sub/b.json"], cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.gpu
def test_kernel_rows_with_documents(tmp_path):
    from lenx.bench.kernels import run_bench

    res = run_bench(methods=("sdpa", "kerple"), lengths=(256,), heads=2, head_dim=32,
                    backends=("sdpa", "flex", "chunked"), out_path=tmp_path / "b.json", rep_ms=5, max_reps=3,
                    commit="test", documents=8, window=64, log=None)
    assert res["args"]["documents"] == 8 and res["args"]["window"] == 64
    ok = {(r["method"], r["backend"]) for r in res["rows"] if r["status"] == "ok" and "fwdbwd_ms" in r}
    assert {("sdpa", "sdpa"), ("sdpa", "flex"), ("sdpa", "chunked"), ("kerple", "flex")} <= ok


def test_each_row_is_written_as_it_finishes(tmp_path):
    """A run cut short (a device call's time limit) keeps the rows it measured."""
    from lenx.bench.train_step import train_step_bench

    out, seen = tmp_path / "step.json", []
    train_step_bench(["rope", "kerple"], preset="tiny", seq_len=8, batch_size=1, steps=1, warmup=0, device="cpu",
                     profile_steps=0, documents=2, out_path=out,
                     log=lambda line: seen.append(len(json.loads(out.read_text())["rows"])))
    assert seen == [1, 2, 3, 4]
