"""The memory a training step takes, estimated before any work starts, and what the device has.

estimate_memory adds up what one step of the decoder holds at its peak: the weights, their
gradients and AdamW's two moments; every layer's activations, kept from its forward for its
backward; the attention's own memory, as the backend the planner picks on the device declares it
(lenx.attention.backends: a [B, H, T, T] score map per layer on the dense reference, one block of
rows on the chunked one, O(T) for SDPA and the fused kernels); and the output layer's logits.
check_memory compares the estimate with available_memory and refuses, in one line, a step that
does not fit. tests/model/test_memory.py measures training steps on the CPU against the estimate.
"""

from dataclasses import dataclass, replace
from pathlib import Path
import sys

import torch

from ..attention import Attention
from ..attention.backends import Work, get_backend, plan_backend
from ..attention.layouts import layer_configs
from ..attention.methods import parse_method
from ..config import ConfigError, LMConfig, RunConfig

GB = 1e9


def _kept_per_element(mlp_ratio: int, item: int) -> int:
    """Bytes each layer keeps for its backward per element of its [B, T, C] activations (measured
    with saved-tensor hooks): the block's input, both LayerNorms' outputs and the residual (fp32
    under autocast too), q, k, v and the rotated q, k, the attention's output and its transposed
    copy, and the MLP's hidden layer (mlp_ratio x C) before and after its activation."""
    return 4 * 4 + (7 + 2 * mlp_ratio) * item


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of one step at its peak, by what holds them."""
    model: int  # weights, and when training their gradients and the optimizer state
    activations: int  # the layers' activations (kept for the backward, and the widest one's gradients)
    attention: int  # the attention's own memory beyond q, k, v and its output
    output: int  # the logits and the loss over them
    backend: str  # the attention backend the planner picks on the device
    training: bool = True  # a training step (else a forward with no gradient)

    @property
    def total(self) -> int:
        return self.model + self.activations + self.attention + self.output

    def describe(self) -> str:
        weights = "weights, gradients and optimizer state" if self.training else "weights"
        return (f"{weights} {self.model / GB:.2f} GB, activations "
                f"{self.activations / GB:.2f} GB, attention ({self.backend}) {self.attention / GB:.2f} GB, "
                f"logits {self.output / GB:.2f} GB")


def estimate_memory(cfg: LMConfig, batch: int, seq_len: int, device: torch.device, precision: str = "auto",
                    training: bool = True, params: int | None = None, outputs: int | None = None,
                    world: int = 1, parallel: str = "ddp", segments: bool = False) -> MemoryEstimate:
    """The peak memory of one step of a decoder of `cfg` on `device`: a training step (forward,
    backward, AdamW update) when `training`, else one forward with no gradient. `batch` sequences
    of `seq_len` tokens go through at once (one micro-batch on one rank). `params`: the model's
    parameter count (default: lenx.model.LM's for cfg), `outputs`: the output layer's width
    (default: cfg.vocab_size). Under torchrun `world` ranks share the work: DDP keeps a second copy
    of the gradients for its buckets, FSDP shards the weights, gradients and optimizer state.
    `segments`: every forward carries document ids (train.documents=masked), which the plan reads."""
    shared: dict = {}
    kinds: dict = {}  # one attention on the CPU per kind of layer (its parts probe the reference backends): [it, layers]
    with torch.random.fork_rng(devices=[]):
        for i, c in enumerate(layer_configs(replace(cfg, backend="auto"), cfg.layers, cfg.n_layer)):
            # MTA's parts differ by layer (it convolves on some): its layers are kinds of their own
            key = (c.method, c.window, i if parse_method(c.method).processor == "mta" else None)
            kinds.setdefault(key, [Attention(c, cfg.n_head, cfg.d_model, shared, i, cfg.n_layer), 0])[1] += 1
    if params is None:  # the LM's: tied embeddings; per layer the attention, the MLP and two LayerNorms
        once = {id(p): p.numel() for part in shared.values() if isinstance(part, torch.nn.Module)
                for p in part.parameters()}  # parts layers share (not RoPE's table cache)
        mlp = 2 * cfg.mlp_ratio * cfg.d_model ** 2 + 4 * cfg.d_model
        layers = sum(n * (sum(p.numel() for p in attn.parameters() if id(p) not in once) + mlp)
                     for attn, n in kinds.values())
        params = cfg.vocab_size * cfg.d_model + layers + sum(once.values()) + 2 * cfg.d_model
    outputs = cfg.vocab_size if outputs is None else outputs
    bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    item = 2 if bf16 else 4
    model = params * 4 + (params * 2 if bf16 else 0)  # autocast caches a bf16 copy of each weight
    if training:
        model += params * 4 * 3  # gradients and AdamW's two moments, fp32
        if world > 1 and parallel == "fsdp":
            model //= world
        elif world > 1:
            model += params * 4  # DDP's gradient buckets
    act = batch * seq_len * cfg.d_model
    logits = batch * seq_len * outputs
    work = Work(batch, cfg.n_head, seq_len, cfg.d_model // cfg.n_head, item, cfg.chunk_size, training)
    plans = [(replace(attn.parts, segments=segments), n) for attn, n in kinds.values()]
    backends = [plan_backend(parts, device, cfg.backend) for parts, _ in plans]
    mems = [(get_backend(b).memory(parts, work), n) for b, (parts, n) in zip(backends, plans)]
    backend = ", ".join(dict.fromkeys(backends))
    peak, kept = max(m.peak for m, _ in mems), sum(n * m.kept for m, n in mems)
    # the loss: the logits (bf16 under autocast) and fp32 copies of them, the log-softmax and in the
    # backward the gradients in and out
    head_peak = logits * (8 + (2 if bf16 else 0))
    if not training:  # one layer at a time, nothing kept
        return MemoryEstimate(model, act * (2 * cfg.mlp_ratio + 2) * item, peak, head_peak, backend, False)
    kept_output = act * 8 + logits * 4  # the final LayerNorm's input and output, the log-softmax of the logits
    mlp_peak = act * 2 * cfg.mlp_ratio * item  # a layer's backward: the MLP's widest gradients at once
    # every layer keeps its activations; the step peaks either at the loss or in a layer's backward
    at_head = head_peak > mlp_peak + peak
    activations = cfg.n_layer * act * _kept_per_element(cfg.mlp_ratio, item) + (0 if at_head else mlp_peak)
    attention = kept + (0 if at_head else peak)
    output = kept_output + (head_peak if at_head else 0)
    return MemoryEstimate(model, activations, attention, output, backend)


def available_memory(device: torch.device) -> int | None:
    """Bytes this process can still take on `device`: free GPU memory (torch.cuda.mem_get_info) on
    CUDA; on the CPU the smaller of MemAvailable (/proc/meminfo) and what the process's cgroup
    limit leaves. None where it cannot be told (not Linux)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    values = dict(line.split(":", 1) for line in meminfo.splitlines() if ":" in line)
    if "MemAvailable" not in values:
        return None
    free = int(values["MemAvailable"].split()[0]) * 1024
    limit = _cgroup_room()
    return free if limit is None else min(free, limit)


def _cgroup_room(proc: Path = Path("/proc/self/cgroup"), mount: Path = Path("/sys/fs/cgroup")) -> int | None:
    """What the memory limits of this process's cgroup and of those above it leave (cgroup v2, or
    v1's memory controller), the page cache they can reclaim counted as free; None without a limit."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            base, names = mount, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            base, names = mount / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        folder = base / path.strip("/")
        rooms += [room for where in (folder, *folder.parents) if where.is_relative_to(base)
                  and (room := _room(where, names)) is not None]
    return min(rooms, default=None)


def _room(where: Path, names: tuple[str, str, str]) -> int | None:
    """Limit - usage + reclaimable page cache of one cgroup folder; None: no limit there, or unreadable."""
    try:
        limit, usage = ((where / name).read_text().strip() for name in names[:2])
    except OSError:
        return None
    if limit == "max" or int(limit) >= 1 << 60:  # unlimited (v1 writes a huge number)
        return None
    cache = 0
    try:
        for stat in (where / "memory.stat").read_text().splitlines():
            key, _, value = stat.partition(" ")
            cache = int(value) if key == names[2] else cache
    except OSError:
        pass
    return max(0, int(limit) - int(usage) + cache)


def check_memory(estimate: MemoryEstimate, device: torch.device, what: str, lower: str,
                 override: str = "--no-memory-check") -> None:
    """A one-line ConfigError when `estimate` does not fit in what `device` has available: `what`
    the step is ("training at train.seq_len=100000 with 16 sequences per micro-batch"), `lower` what
    to change. Where the memory cannot be told, a note on stderr and no check."""
    have = available_memory(device)
    if have is None:
        print(f"note: cannot tell how much memory {device.type} has here; the memory check is skipped",
              file=sys.stderr)
        return
    if estimate.total > have:
        raise ConfigError(
            f"{what} needs about {estimate.total / GB:.1f} GB ({estimate.describe()}) but {device} has "
            f"{have / GB:.1f} GB available; {lower}, or pass {override} if you know it fits")


def check_training_memory(cfg: RunConfig, device: torch.device, world: int = 1,
                          override: str = "--no-memory-check") -> MemoryEstimate:
    """check_memory of one training step of `cfg` (its model.vocab_size the corpus's) on `device`,
    as one of `world` ranks: a micro-batch of train.batch_size / train.grad_accum sequences (this
    rank's share) of train.seq_len tokens. Returns the estimate."""
    t = cfg.train
    rows = max(1, t.batch_size // t.grad_accum // world)
    estimate = estimate_memory(cfg.model, rows, t.seq_len, device, t.precision, world=world, parallel=t.parallel,
                               segments=t.documents == "masked")
    what = f"training at train.seq_len={t.seq_len} with {rows} sequence{'s' if rows > 1 else ''} per micro-batch"
    if world > 1:
        what += f" on each of {world} ranks"
    if rows > 1:
        lower = ("lower train.seq_len or train.batch_size, or raise train.grad_accum (a micro-batch is "
                 f"train.batch_size {t.batch_size} / train.grad_accum {t.grad_accum}"
                 f"{f' / {world} ranks' if world > 1 else ''})")
    else:
        lower = "lower train.seq_len or the model's size (a micro-batch holds one sequence already)"
    check_memory(estimate, device, what, lower, override)
    return estimate
