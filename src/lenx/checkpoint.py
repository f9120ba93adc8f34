"""Checkpoints: safetensors weights + a torch file with optimizer, step and RNG state.

A checkpoint is a folder `ckpt/` in the run directory holding `model.safetensors` and `state.pt`.
It is written as `ckpt.tmp/` and then swapped in, so a run killed at any moment leaves either the
previous checkpoint or the new one, never half of one.
"""

import os
from pathlib import Path
import shutil

from safetensors.torch import load_model, save_model
import torch


class CheckpointError(RuntimeError):
    pass


def checkpoint_dir(run_dir: Path) -> Path | None:
    """The complete checkpoint of a run, if any (a swap interrupted midway leaves ckpt.old)."""
    for name in ("ckpt", "ckpt.old"):
        d = Path(run_dir) / name
        if (d / "model.safetensors").is_file() and (d / "state.pt").is_file():
            return d
    return None


def save_checkpoint(run_dir: Path, model: torch.nn.Module, state: dict) -> Path:
    run_dir = Path(run_dir)
    tmp, final, old = run_dir / "ckpt.tmp", run_dir / "ckpt", run_dir / "ckpt.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    torch.save(state, tmp / "state.pt")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def load_weights(model: torch.nn.Module, ckpt: Path, device="cpu") -> None:
    path = Path(ckpt) / "model.safetensors"
    try:
        missing, unexpected = load_model(model, str(path), strict=False, device=str(device))
    except Exception as e:  # safetensors raises several types for truncated or foreign files
        raise CheckpointError(f"{path} is corrupt or unreadable ({type(e).__name__}: {e}); "
                              "delete the checkpoint folder to start the run again") from None
    if missing or unexpected:
        raise CheckpointError(f"{path} does not match this model's configuration "
                              f"(missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]})")


def load_state(ckpt: Path) -> dict:
    path = Path(ckpt) / "state.pt"
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise CheckpointError(f"{path} is corrupt or unreadable ({type(e).__name__}); "
                              "delete the checkpoint folder to start the run again") from None
