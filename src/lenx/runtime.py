"""What training, evaluation, benchmarking and the CLI share: the device, autocast, the corpus of a
config, the optimizer's parameter groups, and loading a trained run."""

from contextlib import nullcontext
from pathlib import Path

import torch

from .checkpoint import CheckpointError, checkpoint_dir, load_weights
from .config import ConfigError, RunConfig, load_config
from .model import LM


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device=cuda but no CUDA device is visible; use train.device=cpu")
    return torch.device(name)


def autocast_for(device: torch.device, precision: str):
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def open_training_corpus(cfg: RunConfig):
    from .data import open_corpus, prepare_corpus

    root = Path(cfg.data.root)
    if cfg.data.corpus == "synthetic" and not (root / "synthetic" / "manifest.json").exists():
        prepare_corpus("synthetic", root, progress=False)  # embedded and generated in seconds
    return open_corpus(cfg.data.corpus, root)


def param_groups(model: torch.nn.Module, weight_decay: float):
    """Decay matrices and embeddings; leave biases, norms and the position parts' scalars alone."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def load_run(run_dir: Path, device: torch.device, backend: str | None = None) -> tuple[LM, RunConfig]:
    """The trained model of a run directory (its last checkpoint, in eval mode on `device`) and its
    config; `backend` overrides the attention backend it was trained with."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.toml").is_file():
        raise CheckpointError(f"{run_dir} is not a lenx run directory (no config.toml); train one with `lenx train`")
    cfg = load_config(run_dir / "config.toml")
    ckpt = checkpoint_dir(run_dir)
    if ckpt is None:
        raise CheckpointError(f"{run_dir} has no checkpoint yet; train it (or resume it) first")
    if backend:
        cfg.model.backend = backend
    model = LM(cfg.model)
    load_weights(model, ckpt)
    return model.to(device).eval(), cfg
