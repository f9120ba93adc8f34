"""A run's evaluations when a new checkpoint replaces the one they measured (a resume after
train.steps was raised in a finished run's config.toml, or of a run evaluated before it finished).

What was measured is kept: the measured weights become a kept checkpoint, ckpt/step_<N>/ (as
train.keep_every keeps them), and each evaluation of them moves to the name `lenx eval --step N`
gives (eval_step<N>.json, eval_<task>_step<N>.json, eval_step<N>_rope-<scaling>.json, the earlier
ones kept beside them as eval_step<N>.<key>.json), so `lenx eval`, `lenx export`, `lenx plot` and
`lenx compare` reach them as they reach any kept step. eval.json then waits for a new `lenx eval`.
"""

import hashlib
import json
import os
from pathlib import Path
import sys

from ..model.checkpoint import keep_weights, weights_dir, weights_step


def _evaluated_step(path: Path) -> int | None:
    try:
        return json.loads(path.read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        return None


def _latest_evaluations(run_dir: Path) -> list[Path]:
    """The evaluation files of the run's latest checkpoint (not those of kept steps, *_step<N>*)."""
    return [p for p in sorted(Path(run_dir).glob("eval*.json")) if "_step" not in p.name]


def step_name(path: Path, step: int) -> Path:
    """The name `lenx eval --step` gives the evaluation `path` (lenx.evaluation.evaluate.result_name):
    eval_<task>_rope-yarn.json -> eval_<task>_step<N>_rope-yarn.json; a kept eval.<key>.json ->
    eval_step<N>.<key>.json."""
    base, rest = path.name.split(".", 1)
    parts = base.split("_")
    at = next((i for i, part in enumerate(parts) if part.startswith("rope-")), len(parts))
    return path.with_name("_".join(parts[:at] + [f"step{step}"] + parts[at:]) + "." + rest)


def _move(path: Path, step: int) -> Path:
    """Move an evaluation to its step's name; another file there stays, and this one goes beside it
    as <name>.<key>.json, the key a hash of its bytes (as lenx.evaluation.files keeps a file)."""
    target = step_name(path, step)
    if target.exists() and target.read_bytes() != path.read_bytes():
        key = hashlib.sha256(path.read_bytes()).hexdigest()[:8]
        target = target.with_name(f"{target.name.split('.')[0]}.{key}.json")
    os.replace(path, target)
    return target


def keep_evaluated(run_dir: Path, new_step: int) -> None:
    """Before the checkpoint of `new_step` replaces the run's latest one: when an evaluation
    measured the latest one, keep its weights as ckpt/step_<N>/ and move its evaluations to their
    step's names, and say so in one line on stderr."""
    run_dir = Path(run_dir)
    evaluations = _latest_evaluations(run_dir)
    if not evaluations or weights_dir(run_dir) is None:
        return
    step = weights_step(weights_dir(run_dir))
    measured = [p for p in evaluations if step is not None and step != new_step and _evaluated_step(p) == step]
    if not measured:
        return
    kept = keep_weights(run_dir)
    moved = [_move(p, step) for p in measured]
    names = ", ".join(f"{p.name} as {m.name}" for p, m in zip(measured, moved))
    print(f"note: kept the evaluation of step {step} ({names}) and its weights as {kept}, as training goes on "
          f"past it (lenx eval/export {run_dir} --step {step} reach them)", file=sys.stderr)


def drop_stale(run_dir: Path, step: int) -> None:
    """After the checkpoint of `step` is written: remove every evaluation of the latest checkpoint
    that is of another step (keep_evaluated has moved those of the weights it replaced; what is left
    evaluated weights no longer here)."""
    for path in _latest_evaluations(run_dir):
        evaluated = _evaluated_step(path)
        if evaluated != step:
            path.unlink()
            print(f"note: removed {path}: it evaluated the checkpoint of step {evaluated}, which the run no longer "
                  f"has (now at step {step})", file=sys.stderr)
