"""README.md's "On a CPU" lines, run as written from an empty folder (the newcomer audit of
2026-11-28 followed "use -c tiny on a CPU" and its text lines failed on the synthetic corpus): the
```bash block after "**On a CPU.**" through bash, `lenx` and `python` being this test's, with only
`--set` options appended to make training short; then the workflow block's lines that need a text
corpus (generate with a text prompt, export with a tokenizer, eval --hf --like) as written, shrunk
only in --max-new-tokens."""

import json
import os
from pathlib import Path
import re
import subprocess
import sys

import lenx

REPO = Path(__file__).resolve().parents[2]
SRC = str(Path(lenx.__file__).resolve().parents[1])
SHORT = " ".join(f"--set {s}" for s in ("model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.batch_size=2",
                                         "train.steps=3", "train.ckpt_every=3", "eval.max_length=256",
                                         "eval.windows=2", "eval.scored=16", "train.device=cpu"))
# workflow lines that need a text corpus (README "## The workflow" and the export section), as written
TEXT_LINES = ['lenx generate runs/dv2 --prompt "The kernel" --max-new-tokens 200 --temperature 0',
              'lenx generate runs/dv2 --prompt "The kernel" --prompt "A fast" --stop "." --max-new-tokens 64 --json',
              "lenx export runs/dv2 exported/dv2", "lenx eval --hf exported/dv2 --like runs/dv2"]


def cpu_block() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.partition("**On a CPU.**")[2]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, 'README.md has no ```bash block after "**On a CPU.**"'
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_cpu_lines_and_the_text_lines_run_as_written(tmp_path):
    readme = " ".join((REPO / "README.md").read_text().split())
    for line in TEXT_LINES[:2] + ["lenx export runs/dv2 exported/dv2", "lenx eval --hf exported/dv2 --like runs/dv2"]:
        assert line in readme, line
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "lenx").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m lenx "$@"\n')
    (bin_dir / "lenx").chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    work = tmp_path / "work"
    work.mkdir()
    lines = cpu_block()
    assert any("--set data.corpus=mytext" in line and line.startswith("lenx train -c tiny") for line in lines)
    for line in lines:
        if line.startswith(("lenx train", "lenx sweep")):
            line += " " + SHORT + (" --seeds 0" if line.startswith("lenx sweep") else "")
        out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=600, cwd=work, env=env)
        assert out.returncode == 0 and "Traceback" not in out.stderr, f"{line}\n{out.stderr[-3000:]}"
    assert json.loads((work / "runs/dv2/meta.json").read_text())["corpus"] == "mytext"
    for line in TEXT_LINES:
        line = re.sub(r"--max-new-tokens \d+", "--max-new-tokens 4", line)
        out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=600, cwd=work, env=env)
        assert out.returncode == 0 and "Traceback" not in out.stderr, f"{line}\n{out.stderr[-3000:]}"
    assert (work / "exported/dv2/tokenizer.json").is_file()
    assert list((work / "runs").rglob("eval.json"))
