"""Training: a short-sequence LM run with checkpoints that resume exactly."""

from contextlib import nullcontext
import json
import math
from pathlib import Path
import time

import numpy as np
import torch

from . import distributed
from .checkpoint import checkpoint_dir, load_state, load_weights, save_checkpoint
from .config import ConfigError, RunConfig, load_config, to_toml
from .model import LM
from .runinfo import environment


class TrainingDiverged(RuntimeError):
    pass


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


def param_groups(model: torch.nn.Module, weight_decay: float):
    """Decay matrices and embeddings; leave biases, norms and the position parts' scalars alone."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


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

    start_step, state = 0, None
    ckpt = checkpoint_dir(run_dir) if resume else None
    if resume and ckpt is None:
        if info.is_main:
            print(f"no checkpoint in {run_dir} yet: starting from step 0")
    if ckpt is not None:
        # Full weights go into the plain model before it is wrapped or sharded, so any world size
        # can resume any checkpoint.
        load_weights(raw_model, ckpt)
        state = load_state(ckpt)
        start_step = state["step"]
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
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.toml").write_text(to_toml(cfg))
        meta = {"environment": environment(device), "world_size": info.world, "parallel": cfg.train.parallel,
                "backends": raw_model.backends(device), "params": raw_model.num_params(),
                "corpus": corpus.name, "vocab_size": corpus.vocab_size}
        (run_dir / "meta.json").write_text(json.dumps(meta, indent=2))

    batches = Batches(corpus.tokens("train"), cfg.train.seq_len, cfg.train.batch_size, cfg.train.grad_accum,
                      cfg.train.seed, info)
    metrics_path = run_dir / "metrics.jsonl"
    if info.is_main:
        _truncate_metrics(metrics_path, start_step)
    writer = _tensorboard(run_dir) if info.is_main else None
    total = cfg.train.steps
    end = total if stop_after is None else min(total, start_step + stop_after)
    bar = None
    if progress and info.is_main:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=start_step, desc=cfg.model.method, unit="step", dynamic_ncols=True)
    tokens_per_step = cfg.train.batch_size * cfg.train.seq_len
    t_last, last_loss = time.perf_counter(), float("nan")
    model.train()
    for step in range(start_step, end):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss_sum = torch.zeros((), device=device)
        for micro in range(cfg.train.grad_accum):
            x, y = batches.get(step, micro, device)
            sync = distributed.grad_sync(model, cfg.train.parallel, info, micro == cfg.train.grad_accum - 1)
            with sync, autocast_for(device, cfg.train.precision):
                _, loss = step_fn(x, y)
            (loss / cfg.train.grad_accum).backward()
            loss_sum += loss.detach() / cfg.train.grad_accum
        loss_val = float(distributed.mean_across_ranks(loss_sum, info))
        if not math.isfinite(loss_val):
            last = checkpoint_dir(run_dir)
            raise TrainingDiverged(
                f"loss became {loss_val} at step {step + 1}; stopped without saving. Last good checkpoint: "
                f"{last if last else 'none'} (lower train.lr or check the data)")
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        done = step + 1
        last_loss = loss_val
        if info.is_main and (done % cfg.train.log_every == 0 or done == end):
            now = time.perf_counter()
            steps_since = done - max(start_step, done - cfg.train.log_every) or 1
            record = {"step": done, "loss": loss_val, "lr": lr_at(step, cfg), "grad_norm": float(grad_norm),
                      "tokens_per_s": tokens_per_step * steps_since / max(now - t_last, 1e-9), "time": time.time()}
            t_last = now
            with open(metrics_path, "a") as f:
                f.write(json.dumps(record) + "\n")
            if writer is not None:
                for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
                    writer.add_scalar(f"train/{key}", record[key], done)
            if bar is not None:
                bar.set_postfix(loss=f"{loss_val:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
        if bar is not None:
            bar.update(1)
        if done % cfg.train.ckpt_every == 0 or done == end:
            _checkpoint(run_dir, model, raw_model, optimizer, done, device, info, cfg)
    if bar is not None:
        bar.close()
    if writer is not None:
        writer.close()
    return {"run_dir": str(run_dir), "step": end, "final_loss": last_loss, "finished": end == total}


def _checkpoint(run_dir, model, raw_model, optimizer, step, device, info, cfg):
    """Full weights and optimizer state, written by rank 0 alone (atomically, see checkpoint.py);
    the other ranks wait so that none runs ahead of a checkpoint that may yet fail."""
    weights, optim_state = distributed.full_state(model, optimizer, cfg.train.parallel, info)
    if info.is_main:
        plain = raw_model
        if weights is not None:  # FSDP2: raw_model holds shards; rebuild a plain copy from the gathered state
            with torch.random.fork_rng(devices=[]):  # building a model must not move the saved RNG state
                plain = LM(cfg.model)
            distributed.match_shapes(weights, optim_state, {n: p.shape for n, p in plain.named_parameters()})
            plain.load_state_dict(weights)
        save_checkpoint(run_dir, plain, _train_state(step, optim_state, device))
    distributed.barrier(info)


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
