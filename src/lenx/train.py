"""Training: a short-sequence LM run with checkpoints that resume exactly."""

from dataclasses import dataclass
import json
import math
from pathlib import Path
import time
from typing import Callable

import numpy as np
import torch

from . import distributed
from .checkpoint import checkpoint_dir, load_state, load_weights, save_checkpoint
from .config import ConfigError, RunConfig, load_config, to_toml
from .model import LM
from .runinfo import environment
from .runtime import autocast_for, open_training_corpus, param_groups, resolve_device


class TrainingDiverged(RuntimeError):
    pass


def lr_at(step: int, cfg) -> float:
    """Linear warmup, then cosine from lr down to lr * min_lr_ratio at the last step."""
    t = cfg.train
    warmup = max(1, int(t.warmup_frac * t.steps))
    if step < warmup:
        return t.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, t.steps - warmup)
    floor = t.lr * t.min_lr_ratio
    return floor + 0.5 * (t.lr - floor) * (1 + math.cos(math.pi * min(1.0, progress)))


class Batches:
    """The batch of step s depends only on (seed, s): resuming at step s reads exactly what an
    uninterrupted run would, on any number of ranks. Each rank takes its slice of every micro-batch."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, grad_accum: int, seed: int,
                 info: distributed.DistInfo):
        if len(tokens) < seq_len + 2:
            raise ConfigError(f"the training split has {len(tokens)} tokens, fewer than train.seq_len + 2")
        micro = batch_size // grad_accum
        if micro % info.world:
            raise ConfigError(f"micro-batch {micro} (batch_size / grad_accum) must divide by the {info.world} ranks")
        self.tokens, self.seq_len, self.seed, self.info = tokens, seq_len, seed, info
        self.batch_size, self.grad_accum, self.micro = batch_size, grad_accum, micro

    def get(self, step: int, micro_index: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, len(self.tokens) - self.seq_len - 1, size=self.batch_size)
        rows = starts[micro_index * self.micro:(micro_index + 1) * self.micro]
        per_rank = self.micro // self.info.world
        rows = rows[self.info.rank * per_rank:(self.info.rank + 1) * per_rank]
        window = np.stack([self.tokens[s:s + self.seq_len + 1] for s in rows]).astype(np.int64)
        window = torch.from_numpy(window).to(device, non_blocking=True)
        return window[:, :-1], window[:, 1:]


def prepare_run_dir(run_dir: Path, resume: bool) -> None:
    """Refuse to resume what is not a run, and to overwrite a run that already has a checkpoint."""
    run_dir = Path(run_dir)
    if resume and not (run_dir / "config.toml").is_file():
        raise ConfigError(f"cannot resume: {run_dir} has no config.toml (is it a lenx run directory?)")
    if not resume and checkpoint_dir(run_dir) is not None:
        raise ConfigError(f"{run_dir} already holds a trained run; pass --resume to continue it or choose another --out")


def train(cfg: RunConfig, run_dir: Path, resume: bool = False, progress: bool = True,
          stop_after: int | None = None) -> dict:
    """Train `cfg` into `run_dir`. With resume=True continue from the last checkpoint (the run's
    saved config is used). stop_after ends the loop after that many steps (checkpointing first).
    Under torchrun every rank calls this; the batch, loss curve and checkpoints are those of one
    process with the same global batch."""
    run = setup_run(cfg, run_dir, resume)
    total = run.cfg.train.steps
    end = total if stop_after is None else min(total, run.start_step + stop_after)
    metrics = MetricsLogger(run, end, progress)
    loss = float("nan")
    run.model.train()
    for step in range(run.start_step, end):
        loss, grad_norm = train_step(run, step)
        metrics.log(step + 1, loss, lr_at(step, run.cfg), grad_norm)
        checkpoint_if_due(run, step + 1, end)
    metrics.close()
    return {"run_dir": str(run.run_dir), "step": end, "final_loss": loss, "finished": end == total}


@dataclass
class TrainingRun:
    """What the training loop works with, the same on every rank."""
    cfg: RunConfig
    run_dir: Path
    device: torch.device
    info: distributed.DistInfo
    raw_model: LM  # the single-device model (under FSDP2 it holds this rank's shards)
    model: torch.nn.Module  # raw_model wrapped by DDP / FSDP2, or raw_model itself
    step_fn: Callable  # model, compiled when train.compile is set
    optimizer: torch.optim.Optimizer
    batches: Batches
    start_step: int


def setup_run(cfg: RunConfig | None, run_dir: Path, resume: bool) -> TrainingRun:
    """Device and process group, corpus, model, optimizer and (on resume) the checkpoint's weights,
    optimizer and RNG state; rank 0 writes config.toml and meta.json."""
    run_dir = Path(run_dir)
    prepare_run_dir(run_dir, resume)
    if resume:
        cfg = load_config(run_dir / "config.toml")
    device = resolve_device(cfg.train.device)
    info = distributed.setup(device.type)
    if device.type == "cuda" and info.enabled:
        device = torch.device("cuda", info.local_rank)
    with distributed.main_first(info):  # rank 0 builds the synthetic corpus if it is missing
        corpus = open_training_corpus(cfg)
    cfg.model.vocab_size = corpus.vocab_size
    torch.manual_seed(cfg.train.seed)
    raw_model = LM(cfg.model)
    # Full weights go into the plain model before it is wrapped or sharded, so any world size can
    # resume any checkpoint.
    state = _load_checkpoint(run_dir, raw_model, info) if resume else None
    raw_model.to(device)
    model = distributed.parallelize(raw_model, cfg.train.parallel, info)
    optimizer = torch.optim.AdamW(param_groups(model, cfg.train.weight_decay), lr=cfg.train.lr,
                                  betas=(cfg.train.beta1, cfg.train.beta2), fused=device.type == "cuda")
    if state is not None:
        distributed.load_optimizer_state(model, optimizer, state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        if device.type == "cuda" and "cuda" in state["rng"]:
            torch.cuda.set_rng_state(state["rng"]["cuda"])
    step_fn = torch.compile(model) if cfg.train.compile else model
    if info.is_main:
        _write_run_files(run_dir, cfg, device, info, raw_model, corpus)
    batches = Batches(corpus.tokens("train"), cfg.train.seq_len, cfg.train.batch_size, cfg.train.grad_accum,
                      cfg.train.seed, info)
    return TrainingRun(cfg, run_dir, device, info, raw_model, model, step_fn, optimizer, batches,
                       state["step"] if state is not None else 0)


def _load_checkpoint(run_dir: Path, raw_model: LM, info: distributed.DistInfo) -> dict | None:
    """Load the last checkpoint's weights into raw_model and return its training state (None when
    there is no checkpoint yet)."""
    ckpt = checkpoint_dir(run_dir)
    if ckpt is None:
        if info.is_main:
            print(f"no checkpoint in {run_dir} yet: starting from step 0")
        return None
    load_weights(raw_model, ckpt)
    return load_state(ckpt)


def _write_run_files(run_dir: Path, cfg: RunConfig, device, info, raw_model: LM, corpus) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(to_toml(cfg))
    meta = {"environment": environment(device), "world_size": info.world, "parallel": cfg.train.parallel,
            "backends": raw_model.backends(device), "params": raw_model.num_params(),
            "corpus": corpus.name, "vocab_size": corpus.vocab_size}
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=2))


def train_step(run: TrainingRun, step: int) -> tuple[float, torch.Tensor]:
    """One optimizer step over train.grad_accum micro-batches. Returns the loss (the mean over ranks)
    and the gradient norm before clipping; raises TrainingDiverged on a non-finite loss, before the
    optimizer can apply it."""
    cfg, device = run.cfg, run.device
    accum = cfg.train.grad_accum
    for group in run.optimizer.param_groups:
        group["lr"] = lr_at(step, cfg)
    loss_sum = torch.zeros((), device=device)
    for micro in range(accum):
        x, y = run.batches.get(step, micro, device)
        sync = distributed.grad_sync(run.model, cfg.train.parallel, run.info, micro == accum - 1)
        with sync, autocast_for(device, cfg.train.precision):
            _, loss = run.step_fn(x, y)
        (loss / accum).backward()
        loss_sum += loss.detach() / accum
    loss_val = float(distributed.mean_across_ranks(loss_sum, run.info))
    if not math.isfinite(loss_val):
        last = checkpoint_dir(run.run_dir)
        raise TrainingDiverged(
            f"loss became {loss_val} at step {step + 1}; stopped without saving. Last good checkpoint: "
            f"{last if last else 'none'} (lower train.lr or check the data)")
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.train.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return loss_val, grad_norm


class MetricsLogger:
    """metrics.jsonl, TensorBoard scalars and a progress bar, kept by rank 0 alone: on the other
    ranks every method does nothing. A record is written every train.log_every steps and at the last."""

    def __init__(self, run: TrainingRun, end: int, progress: bool):
        self.active = run.info.is_main
        self.end, self.start_step = end, run.start_step
        self.log_every = run.cfg.train.log_every
        self.tokens_per_step = run.cfg.train.batch_size * run.cfg.train.seq_len
        self.path = run.run_dir / "metrics.jsonl"
        self.writer = self.bar = None
        if self.active:
            _truncate_metrics(self.path, run.start_step)
            self.writer = _tensorboard(run.run_dir)
            if progress:
                from tqdm import tqdm

                self.bar = tqdm(total=run.cfg.train.steps, initial=run.start_step, desc=run.cfg.model.method,
                                unit="step", dynamic_ncols=True)
        self.t_last = time.perf_counter()

    def log(self, done: int, loss: float, lr: float, grad_norm: torch.Tensor) -> None:
        """After step `done` (1-based) has been taken."""
        if not self.active:
            return
        if done % self.log_every == 0 or done == self.end:
            now = time.perf_counter()
            steps_since = done - max(self.start_step, done - self.log_every) or 1
            record = {"step": done, "loss": loss, "lr": lr, "grad_norm": float(grad_norm),
                      "tokens_per_s": self.tokens_per_step * steps_since / max(now - self.t_last, 1e-9),
                      "time": time.time()}
            self.t_last = now
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
            if self.writer is not None:
                for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
                    self.writer.add_scalar(f"train/{key}", record[key], done)
            if self.bar is not None:
                self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()


def checkpoint_if_due(run: TrainingRun, done: int, end: int) -> None:
    """Every train.ckpt_every steps and at the last step: full weights and optimizer state, written
    by rank 0 alone (atomically, see checkpoint.py); the other ranks wait so that none runs ahead of
    a checkpoint that may yet fail."""
    if done % run.cfg.train.ckpt_every and done != end:
        return
    weights, optim_state = distributed.full_state(run.model, run.optimizer, run.cfg.train.parallel, run.info)
    if run.info.is_main:
        plain = run.raw_model
        if weights is not None:  # FSDP2: raw_model holds shards; rebuild a plain copy from the gathered state
            with torch.random.fork_rng(devices=[]):  # building a model must not move the saved RNG state
                plain = LM(run.cfg.model)
            distributed.match_shapes(weights, optim_state, {n: p.shape for n, p in plain.named_parameters()})
            plain.load_state_dict(weights)
        save_checkpoint(run.run_dir, plain, _train_state(done, optim_state, run.device))
    distributed.barrier(run.info)


def _train_state(step, optim_state, device) -> dict:
    rng = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return {"step": step, "optimizer": optim_state, "rng": rng}


def _truncate_metrics(path: Path, step: int) -> None:
    """On resume, drop records logged after the checkpoint so the curve has no duplicates."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in keep))


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / "tb"))
