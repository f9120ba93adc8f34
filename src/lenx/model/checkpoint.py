"""Checkpoints: safetensors weights + a torch file with optimizer, step and RNG state.

A checkpoint is a folder `ckpt/` in the run directory holding `model.safetensors` and `state.pt`.
It is written as `ckpt.tmp/` and then swapped in, so a run killed at any moment leaves either the
previous checkpoint or the new one, never half of one. The weights carry their step in the
safetensors metadata, so evaluation needs nothing but them.

Kept checkpoints (`train.keep_every`) are weights only, `ckpt/step_<N>/model.safetensors`; each
new checkpoint carries the kept ones over as hard links (copies where links are not possible).
"""

import os
from pathlib import Path
import shutil

from safetensors import safe_open
from safetensors.torch import load_model, save_model
import torch

from ..fileio import atomic_path


class CheckpointError(RuntimeError):
    pass


WEIGHTS, STATE = "model.safetensors", "state.pt"


def _current(run_dir: Path) -> Path | None:
    """ckpt/, or ckpt.old/ where a swap stopped between its two renames (ckpt/ is then absent)."""
    for name in ("ckpt", "ckpt.old"):
        d = Path(run_dir) / name
        if d.is_dir():
            return d
    return None


def checkpoint_dir(run_dir: Path) -> Path | None:
    """The complete checkpoint of a run (weights and training state), if any."""
    d = _current(run_dir)
    return d if d is not None and (d / WEIGHTS).is_file() and (d / STATE).is_file() else None


def weights_dir(run_dir: Path) -> Path | None:
    """The folder of a run's latest weights, whatever the state of its state.pt."""
    d = _current(run_dir)
    return d if d is not None and (d / WEIGHTS).is_file() else None


def kept_steps(run_dir: Path) -> list[int]:
    d = _current(run_dir)
    if d is None:
        return []
    steps = [p.parent.name.removeprefix("step_") for p in d.glob(f"step_*/{WEIGHTS}")]
    return sorted(int(s) for s in steps if s.isdigit())


def kept_dir(run_dir: Path, step: int) -> Path:
    """The kept weights of step `step`; a CheckpointError names the kept steps otherwise."""
    d = _current(run_dir)
    if d is None or not (d / f"step_{step}" / WEIGHTS).is_file():
        kept = kept_steps(run_dir)
        raise CheckpointError(f"{run_dir} kept no checkpoint of step {step} (kept steps: "
                              f"{', '.join(map(str, kept)) or 'none; train with train.keep_every to keep some'})")
    return d / f"step_{step}"


def resume_dir(run_dir: Path) -> Path | None:
    """The checkpoint a resume continues from; None when the run never wrote one. A checkpoint
    folder without both files is damage: a CheckpointError says what is missing and what to do."""
    run_dir = Path(run_dir)
    d = _current(run_dir)
    if d is None:
        return None
    missing = [name for name in (WEIGHTS, STATE) if not (d / name).is_file()]
    if not missing:
        return d
    if missing == [STATE]:
        raise CheckpointError(
            f"{d / STATE} is missing, so training cannot continue (it holds the optimizer, step and RNG state); "
            f"the weights beside it are untouched and `lenx eval {run_dir}` still works; to train again, start a "
            f"new run: lenx train -c {run_dir / 'config.toml'} -o NEW_DIR")
    raise CheckpointError(f"{d} is damaged (no {' and no '.join(missing)}): the run can neither resume nor be "
                          f"evaluated; train it again: lenx train -c {run_dir / 'config.toml'} -o NEW_DIR")


def save_checkpoint(run_dir: Path, model: torch.nn.Module, state: dict, keep: bool = False) -> Path:
    """Write weights and state as the run's checkpoint; keep=True also keeps these weights as
    ckpt/step_<step>/."""
    run_dir = Path(run_dir)
    tmp, final, old = run_dir / "ckpt.tmp", run_dir / "ckpt", run_dir / "ckpt.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    step = int(state["step"])
    with atomic_path(tmp / WEIGHTS) as path:  # with the permissions of a new file, which safetensors does not give
        save_model(model, str(path), metadata={"step": str(step)})
    torch.save(state, tmp / STATE)
    previous = _current(run_dir)
    for kept in kept_steps(run_dir):
        if keep and kept == step:
            continue
        _link(previous / f"step_{kept}" / WEIGHTS, tmp / f"step_{kept}" / WEIGHTS)
    if keep:
        _link(tmp / WEIGHTS, tmp / f"step_{step}" / WEIGHTS)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def keep_weights(run_dir: Path) -> Path | None:
    """Keep the run's latest weights as a kept checkpoint of their step, ckpt/step_<N>/ (a hard
    link), which every later checkpoint carries over; returns that folder, None when the run has no
    weights of a known step."""
    d = weights_dir(run_dir)
    step = weights_step(d) if d is not None else None
    if step is None:
        return None
    kept = d / f"step_{step}"
    if not (kept / WEIGHTS).is_file():
        _link(d / WEIGHTS, kept / WEIGHTS)
    return kept


def _link(src: Path, dst: Path) -> None:
    """A file is never rewritten in place once saved, so a hard link is as good as a copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def load_weights(model: torch.nn.Module, ckpt: Path, device="cpu") -> None:
    path = Path(ckpt) / WEIGHTS
    try:
        missing, unexpected = load_model(model, str(path), strict=False, device=str(device))
    except Exception as e:  # safetensors raises several types for truncated or foreign files
        raise CheckpointError(f"{path} is corrupt or unreadable ({type(e).__name__}: {e}); "
                              "the run cannot be evaluated or resumed from it") from None
    if missing or unexpected:
        raise CheckpointError(f"{path} does not match this model's configuration "
                              f"(missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]})")


def load_state(ckpt: Path) -> dict:
    path = Path(ckpt) / STATE
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        run_dir = Path(ckpt).parent
        raise CheckpointError(
            f"{path} is corrupt or unreadable ({type(e).__name__}), so training cannot continue; the weights "
            f"may still be evaluated (`lenx eval {run_dir}`); to train again, start a new run: "
            f"lenx train -c {run_dir / 'config.toml'} -o NEW_DIR") from None


def weights_step(ckpt: Path) -> int | None:
    """The training step of the weights in `ckpt`: from their metadata, else (checkpoints written
    before the weights carried it) from a readable state.pt; None when neither says."""
    try:
        with safe_open(str(Path(ckpt) / WEIGHTS), "pt") as f:
            step = (f.metadata() or {}).get("step")
        if step is not None and step.isdigit():
            return int(step)
    except Exception:  # unreadable weights: load_weights reports that
        pass
    if (Path(ckpt) / STATE).is_file():
        try:
            return int(load_state(ckpt)["step"])
        except (CheckpointError, KeyError, TypeError, ValueError):
            return None
    return None
