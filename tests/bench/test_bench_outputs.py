"""`lenx bench`'s JSON output and guards, run as a user runs it (subprocesses, relative paths, another
working directory): it never replaces a file it did not write, replaces its own default file only
with --force, and refuses a training step that cannot fit the memory before any work."""

import hashlib
import json
import subprocess
import sys

STEP = ["bench", "--train-step", "--device", "cpu", "--preset", "tiny", "--methods", "rope", "--seq-len", "8",
        "--batch", "1", "--steps", "1", "--warmup", "0", "--profile-steps", "0"]
DECODE = ["bench", "--decode", "--device", "cpu", "--preset", "tiny", "--methods", "rope", "--contexts", "8",
          "--batches", "1", "--steps", "1", "--warmup", "0", "--repeats", "1", "--modes", "eager",
          "--gpt2-modes", "none"]


def lenx(args, cwd):
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600, cwd=cwd)


def refused(proc, words):
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_bench_never_overwrites_a_file_it_did_not_write(tmp_path):
    (tmp_path / "afile.txt").write_text("precious\n")
    for args in (STEP, DECODE):
        proc = lenx([*args, "-o", "afile.txt"], tmp_path)
        refused(proc, "afile.txt exists and was not written by lenx bench")
        assert (tmp_path / "afile.txt").read_text() == "precious\n"
        assert "wrote" not in proc.stdout  # refused before any timing
    # even with --force: --force replaces only an earlier benchmark
    refused(lenx([*STEP, "-o", "afile.txt", "--force"], tmp_path), "was not written by lenx bench")
    assert (tmp_path / "afile.txt").read_text() == "precious\n"


def test_the_default_output_is_replaced_only_with_force(tmp_path):
    first = lenx(STEP, tmp_path)
    assert first.returncode == 0, first.stderr
    saved = tmp_path / "bench_train_step.json"
    assert json.loads(saved.read_text())["written_by"] == "lenx bench"
    digest = hashlib.md5(saved.read_bytes()).hexdigest()
    refused(lenx(STEP, tmp_path), "bench_train_step.json holds an earlier benchmark; pass --force")
    assert hashlib.md5(saved.read_bytes()).hexdigest() == digest
    assert lenx([*STEP, "--force"], tmp_path).returncode == 0
    # a file of bench's named with --out is the user's choice, as with lenx compare --out
    sub = tmp_path / "sub"
    sub.mkdir()
    assert lenx([*STEP, "-o", "../bench_train_step.json"], sub).returncode == 0
    assert json.loads(saved.read_text())["benchmark"] == "train_step"


def test_a_train_step_that_cannot_fit_is_refused_before_any_work(tmp_path):
    proc = lenx([*STEP, "--seq-len", "100000", "--batch", "16", "-o", "big.json"], tmp_path)
    refused(proc, "rope: a training step of 16 sequences of 100000 tokens needs about")
    assert "lower --seq-len or --batch, or pass --no-memory-check" in proc.stderr
    assert not (tmp_path / "big.json").exists()
    refused(lenx([*DECODE, "--no-memory-check"], tmp_path), "--no-memory-check applies to --train-step")
