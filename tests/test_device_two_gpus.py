"""scripts/device/two_gpus.sh runs its two commands side by side, each on its own GPU (the
CUDA_VISIBLE_DEVICES it sets), logs each to $OUT/gpuN.log, waits for both and reports both exit codes;
a missing command is a one-line error before anything runs. No GPU needed: the commands here only
print what they see."""

import os
from pathlib import Path
import subprocess

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device" / "two_gpus.sh"


def run(tmp_path, **env):
    full = {k: v for k, v in os.environ.items() if k not in ("GPU0", "GPU1", "OUT")} | env
    return subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=60)


def test_each_command_gets_its_own_gpu_and_log(tmp_path):
    out = tmp_path / "out"
    # each job waits for the other's file: they can only both finish if they run at the same time
    got = run(tmp_path, OUT=str(out),
              GPU0=f'touch {tmp_path}/a; until [ -f {tmp_path}/b ]; do sleep 0.05; done; echo first $CUDA_VISIBLE_DEVICES',
              GPU1=f'touch {tmp_path}/b; until [ -f {tmp_path}/a ]; do sleep 0.05; done; echo second $CUDA_VISIBLE_DEVICES; exit 3')
    assert got.stdout.strip() == "gpu0 rc=0 gpu1 rc=3", got.stderr
    assert (out / "gpu0.log").read_text().strip() == "first 0"
    assert (out / "gpu1.log").read_text().strip() == "second 1"


def test_a_missing_command_is_one_line(tmp_path):
    got = run(tmp_path, OUT=str(tmp_path / "out"), GPU0="true")
    assert got.returncode != 0 and len(got.stderr.strip().splitlines()) == 1 and "GPU1" in got.stderr
    assert not (tmp_path / "out").exists()
