"""torch.distributed plumbing, kept out of the model (torchtitan-style).

Under `torchrun`, `setup()` starts the process group and `parallelize()` wraps the finished
single-device model in DDP or FSDP2 (`fully_shard` per block, then the root). Without torchrun
everything here is a no-op and the run is an ordinary single-process one.
"""

from dataclasses import dataclass
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


def setup(device_kind: str) -> DistInfo:
    """Start the process group if launched by torchrun (NCCL on CUDA, gloo on CPU)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))
    if not dist.is_initialized():
        backend = "nccl" if device_kind == "cuda" else "gloo"
        if device_kind == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend)
    return info


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def parallelize(model: torch.nn.Module, mode: str, info: DistInfo) -> torch.nn.Module:
    """Wrap the model for data parallelism: DDP (replicated) or FSDP2 (sharded per block)."""
    if not info.enabled:
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        device_ids = [info.local_rank] if next(model.parameters()).is_cuda else None
        return DDP(model, device_ids=device_ids)
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model
    raise ValueError(f"unknown parallel mode {mode!r}; choose ddp or fsdp")


def mean_across_ranks(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= info.world
    return value


def broadcast_error(failed: bool, info: DistInfo) -> bool:
    """True on every rank if any rank failed, so all ranks stop together."""
    if not info.enabled:
        return failed
    flag = torch.tensor([1.0 if failed else 0.0])
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)
