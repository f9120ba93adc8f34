"""torch.distributed plumbing, kept out of the model (torchtitan-style).

Under `torchrun`, `setup()` starts the process group and `parallelize()` wraps the finished
single-device model in DDP or FSDP2 (`fully_shard` per block, then the root). Without torchrun
everything here is a no-op and the run is an ordinary single-process one.

Checkpoints hold full (unsharded) state only, so a run saved on N processes resumes on any M:
`full_state()` gathers it for rank 0 and `load_optimizer_state()` scatters it back.
"""

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
import gc
import os

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def launched_info() -> DistInfo:
    """What torchrun told this process (rank 0 of 1 without torchrun); needs no process group."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistInfo()
    return DistInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))


def setup(device_kind: str) -> DistInfo:
    """Start the process group if launched by torchrun (NCCL on CUDA, gloo on CPU)."""
    info = launched_info()
    if info.world == 1 or dist.is_initialized():
        return info
    if device_kind == "cuda":
        torch.cuda.set_device(info.local_rank)
        # Binding the device up front lets NCCL set up eagerly and barrier() use the right GPU.
        dist.init_process_group("nccl", device_id=torch.device("cuda", info.local_rank))
    else:
        dist.init_process_group("gloo")
    return info


def teardown() -> None:
    """Shut the process group down after a successful run (a failed rank just exits)."""
    if dist.is_initialized():
        # FSDP2's modules and hooks form reference cycles that keep collective Work objects alive;
        # freed only at interpreter exit, gloo's would abort the process. Free them now.
        gc.collect()
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


@contextmanager
def main_first(info: DistInfo):
    """Rank 0 runs the block first (e.g. builds a corpus on disk), then the others run it, so no
    two processes write the same files. If rank 0 fails, it exits and torchrun stops the rest."""
    if not info.is_main:
        barrier(info)
    yield
    if info.is_main:
        barrier(info)


def _blocks_share_modules(blocks) -> bool:
    """True if some module sits in more than one block (T5's bias table is one per model)."""
    seen: set[int] = set()
    for block in blocks:
        ids = {id(m) for m in block.modules()}
        if seen & ids:
            return True
        seen |= ids
    return False


def parallelize(model: torch.nn.Module, mode: str, info: DistInfo) -> torch.nn.Module:
    """Wrap the model for data parallelism: DDP (replicated) or FSDP2 (sharded per block)."""
    if not info.enabled:
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        device_ids = [info.local_rank] if next(model.parameters()).is_cuda else None
        return DDP(model, device_ids=device_ids)
    if mode == "fsdp":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:  # torch < 2.6
            from torch.distributed._composable.fsdp import fully_shard

        # One unit per block, so only one block's weights are gathered at a time. A part shared by
        # several blocks cannot live in one block's unit, nor in a unit of its own (FlexAttention
        # reads T5's table outside the module's forward, where it would still be sharded): then the
        # whole model is one unit, which still shards weights, gradients and optimizer state at rest.
        _vectorize_scalars(model)
        if not _blocks_share_modules(model.blocks):
            for block in model.blocks:
                fully_shard(block)
        fully_shard(model)  # the rest: embeddings (tied to the head) and the final norm
        return model
    raise ValueError(f"unknown parallel mode {mode!r}; choose ddp or fsdp")


def _vectorize_scalars(model: torch.nn.Module) -> None:
    """FSDP2 cannot shard 0-dim parameters (FIRE's c and L_mult): make them 1-element vectors, which
    broadcast the same. Checkpoints keep the original shapes (see match_shapes)."""
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if p.dim() == 0:
                setattr(module, name, torch.nn.Parameter(p.detach().reshape(1), requires_grad=p.requires_grad))


def match_shapes(weights: dict | None, optim: dict | None, shapes: dict[str, torch.Size]) -> None:
    """Reshape, in place, the tensors of a full model / optimizer state whose parameter has the same
    number of elements but another shape in `shapes` (name -> shape): the 0-dim parameters that
    FSDP2 holds as 1-element vectors. The optimizer's step counter keeps its own shape."""

    def fit(name, key, t):
        want = shapes.get(name)
        if key == "step" or want is None or not torch.is_tensor(t) or t.shape == want or t.numel() != want.numel():
            return t
        return t.reshape(want)

    for name, t in (weights or {}).items():
        weights[name] = fit(name, None, t)
    for name, entry in (optim or {}).get("state", {}).items():
        for key, t in entry.items():
            entry[key] = fit(name, key, t)


def grad_sync(model: torch.nn.Module, mode: str, info: DistInfo, sync: bool):
    """Context for one micro-batch's backward: with sync=False gradients only accumulate locally
    and are reduced across ranks with the last micro-batch of the step."""
    if not info.enabled:
        return nullcontext()
    if mode == "ddp":
        return nullcontext() if sync else model.no_sync()
    model.set_requires_gradient_sync(sync)  # FSDP2: a flag rather than a context
    return nullcontext()


def mean_across_ranks(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Every rank gets the mean; the training loss goes through this, so a NaN on any rank is
    seen by all of them and they stop at the same step."""
    if info.enabled:
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= info.world
    return value


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, mode: str, info: DistInfo):
    """(model state, optimizer state), both full (on the CPU when distributed), on rank 0; other
    ranks get (None, {}). Every rank must call it: under FSDP2 it gathers the shards. The model
    state is None when the caller's unwrapped model already holds the full weights (one process, DDP)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    # cpu_offload with full_state_dict gathers to rank 0 only, on the CPU.
    opts = StateDictOptions(full_state_dict=True, cpu_offload=info.enabled)
    optim = get_optimizer_state_dict(model, optimizer, options=opts)
    weights = None
    if info.enabled and mode == "fsdp":
        weights = get_model_state_dict(model, options=opts)
    if not info.is_main:
        return None, {}
    return weights, optim


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a full optimizer state (saved from any number of ranks) into the wrapped model's
    optimizer: under FSDP2 each rank keeps its own shard of it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    # The saved state has the plain model's shapes; the wrapped model may hold some as vectors.
    match_shapes(None, state, {n.removeprefix("module."): p.shape for n, p in model.named_parameters()})
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
