"""The precision a model runs in: bf16 autocast where the config asks for it (train.precision), or
on CUDA by default. Training, evaluation, generation, CHE and the benchmarks all take it from here."""

from contextlib import nullcontext

import torch


def autocast_for(device: torch.device, precision: str):
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()
