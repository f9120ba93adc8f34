"""The README's workflow block, run as a user would: every command line of the ```bash block under
"## The workflow" in README.md, in order, through `python -m lenx` from an empty folder, with the
README's relative paths. A line is shrunk to CPU size only through the table below, keyed by its
text; GPU-only lines are skipped there with the reason. A line the table does not know fails, so
the block cannot drift from what lenx does."""

import json
import os
from pathlib import Path
import random
import re
import shlex
import subprocess
import sys

import torch

import lenx
from lenx.config import load_config
from lenx.model import LM

REPO = Path(__file__).resolve().parents[1]
SRC = str(Path(lenx.__file__).resolve().parents[1])  # subprocesses run the lenx this test imports
PILE_SAMPLE = REPO / "tests" / "fixtures" / "data" / "pile_sample.jsonl"

# `small` on a CPU: the tiny preset shrunk further, a few steps, on a local stand-in for `tech`.
# The README's own --set options come after these, so they still apply.
SMALL_ON_CPU = "-c tiny " + " ".join(f"--set {s}" for s in [
    "model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=64", "train.batch_size=2",
    "train.steps=3", "train.ckpt_every=3", "train.device=cpu", "data.corpus=\"'tech-standin'\"",
    "eval.max_length=128", "eval.windows=2", "eval.scored=16"])

# README command (without its comment) -> [(text in it, what this test runs instead)]; [] runs it as written.
ADAPTED = {
    "lenx list": [],
    # `tech` is fetched from package registries: a local JSONL of the same kind of text stands in
    "lenx prepare tech": [("prepare tech", "prepare tech-standin --from tech.jsonl --vocab-size 300")],
    "lenx prepare mydata --from ~/pile/arxiv.jsonl": [("~/pile/arxiv.jsonl", f"{PILE_SAMPLE} --vocab-size 300")],
    "lenx train -c small --set model.method=dapev2-kerple --set train.seq_len=128 -o runs/dv2":
        [("-c small", SMALL_ON_CPU)],
    "lenx train --resume runs/dv2": [],  # the run has finished: it says so and exits 0
    "lenx eval runs/dv2 --lengths 128,256,512,1024,2048,4096,8192":
        [("128,256,512,1024,2048,4096,8192", "128,256")],
    "lenx eval runs/dv2 --task copy": [("--task copy", "--task copy --depths 0.5 --samples 2")],
    'lenx generate runs/dv2 --prompt "The kernel" --max-new-tokens 200 --temperature 0':
        [("--max-new-tokens 200", "--max-new-tokens 16")],
    "lenx export runs/dv2 exported/dv2": [],
    'lenx generate runs/dv2 --prompt "The kernel" --prompt "A fast" --stop "." --max-new-tokens 64 --json':
        [("--max-new-tokens 64", "--max-new-tokens 8")],
    "lenx sweep --methods rope,kerple,dapev2-kerple -c small --seeds 0,1,2 -o runs/sweep128":
        [("-c small", SMALL_ON_CPU)],
    "lenx eval runs/sweep128/rope-s0 --rope-scaling yarn": [],
    "lenx compare runs/sweep128 --reference kerple": [],
    "lenx plot runs/sweep128": [],
    "lenx plot results/repro -o figures/repro": [],  # results/ is the repository's (a link in the folder)
    "lenx plot runs/dv2 --attention --length 64": [],
    "lenx che --preset smoke": [("--preset smoke", "--preset smoke --tasks parity_check --methods rope --steps 2 "
                                                   "--test-max-length 45 --test-samples 4")],
}
SKIPPED = {
    "lenx bench -o bench.json": "times the fused GPU kernels against SDPA: needs CUDA (tests/test_bench.py runs "
                                "lenx bench --device cpu)",
    "lenx bench --train-step --preset 125m --seq-len 512": "a 125m training step per method: a GPU measurement",
    "lenx bench --train-step --seq-len 2048 --batch 8 --documents 8": "a 125m training step per method, packed and "
                                                                     "not: a GPU measurement (tests/bench/"
                                                                     "test_bench_documents.py runs it on the CPU)",
    "lenx bench --train-step --backend-for dapev2-kerple=chunked": "a 125m training step with a forced backend: "
                                                                   "a GPU measurement",
    "lenx bench --decode -o bench_decode.json": "decode steps of a 125m model per method and context, against "
                                                "transformers' compiled GPT-2: a GPU measurement "
                                                "(tests/bench/test_decode_bench.py runs it with --device cpu)",
    "torchrun --nproc-per-node 2 -m lenx train -c 125m": "two GPUs (tests/test_distributed.py runs DDP and FSDP2 "
                                                         "on CPU processes)",
}


def workflow_commands() -> list[str]:
    """The command lines of README.md's ```bash block under "## The workflow", without comments."""
    readme = (REPO / "README.md").read_text()
    section = readme.partition("\n## The workflow\n")[2]
    assert section, 'README.md has no "## The workflow" section'
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, 'README.md has no ```bash block under "## The workflow"'
    return [re.sub(r"\s+#\s.*$", "", line).strip() for line in block.group(1).splitlines() if line.strip()]


def adapt(command: str) -> list[str]:
    """The arguments of `lenx` this test runs for a README command."""
    assert command in ADAPTED, (f"README workflow line {command!r} is not known to this test: add it to ADAPTED "
                                "(run, shrunk to CPU size) or SKIPPED (with the reason) in "
                                "tests/test_readme_workflow.py")
    for old, new in ADAPTED[command]:
        assert command.count(old) == 1, f"ADAPTED[{command!r}]: {old!r} is not in the command once"
        command = command.replace(old, new)
    program, *args = shlex.split(command)
    assert program == "lenx", command
    return args


def test_the_table_knows_every_line_of_the_workflow_block_and_no_other():
    commands = workflow_commands()
    assert len(commands) == len(set(commands)), "a line of the workflow block appears twice"
    for command in commands:
        if command not in SKIPPED:
            adapt(command)
    stale = (set(ADAPTED) | set(SKIPPED)) - set(commands)
    assert not stale, f"no longer in README.md's workflow block: {sorted(stale)}; remove them from the table"
    assert not set(ADAPTED) & set(SKIPPED)


def write_tech_standin(path: Path, docs: int = 60) -> None:
    """Documents of words about attention, each starting "The kernel", as a JSONL {"text": ...}."""
    words = ("the kernel attention score map head token window length train model layer query key value "
             "sequence").split()
    rng = random.Random(0)
    texts = ["The kernel " + " ".join(rng.choices(words, k=rng.randint(80, 200))) + "." for _ in range(docs)]
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))


def files(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")}


def test_the_workflow_block_runs_as_written(tmp_path):
    write_tech_standin(tmp_path / "tech.jsonl")
    (tmp_path / "results").symlink_to(REPO / "results")  # as run from the repository's root
    tracked = files(REPO / "results" / "repro")
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for command in workflow_commands():
        if command in SKIPPED:
            continue
        out = subprocess.run([sys.executable, "-m", "lenx", *adapt(command)], capture_output=True, text=True,
                             timeout=600, cwd=tmp_path, env=env)
        assert out.returncode == 0 and "Traceback" not in out.stderr, f"{command}\n{out.stderr[-3000:]}"
    assert files(REPO / "results" / "repro") == tracked, "lenx plot rewrote the repository's figures"
    assert list((tmp_path / "figures" / "repro").rglob("*.png"))
    for made in ("runs/dv2/eval.json", "runs/dv2/eval_copy.json", "runs/sweep128/results.json",
                 "runs/sweep128/rope-s0/eval_rope-yarn.json", "compare.json", "runs/dv2/attention_L0_H0.png",
                 "exported/dv2/model.safetensors", "exported/dv2/tokenizer.json"):
        assert (tmp_path / made).is_file(), made


def test_the_readme_states_the_parameters_of_small():
    """`small` with `tech`'s vocabulary (16,384 tokens, lenx prepare's default), counted by lenx."""
    model = load_config("small").model
    model.vocab_size = 16384
    with torch.device("meta"):
        n = LM(model).num_params()
    assert f"`small` ({n / 1e6:.1f}M parameters with the 16,384-token vocabulary of `tech`)" in \
        " ".join((REPO / "README.md").read_text().split())
