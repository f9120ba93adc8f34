"""The optimizer of a run and its learning-rate schedule."""

import math

import torch

from ..config import RunConfig, TrainConfig


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices and embeddings; leave biases, norms and the position parts' scalars alone."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adamw(model: torch.nn.Module, train: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with the [train] section's settings (fused on CUDA)."""
    return torch.optim.AdamW(param_groups(model, train.weight_decay), lr=train.lr, betas=(train.beta1, train.beta2),
                             fused=device.type == "cuda")


def lr_at(step: int, cfg: RunConfig) -> float:
    """Linear warmup, then cosine from lr down to lr * min_lr_ratio at the last step."""
    t = cfg.train
    warmup = max(1, int(t.warmup_frac * t.steps))
    if step < warmup:
        return t.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, t.steps - warmup)
    floor = t.lr * t.min_lr_ratio
    return floor + 0.5 * (t.lr - floor) * (1 + math.cos(math.pi * min(1.0, progress)))
