"""Training: a short-sequence LM run with checkpoints that resume exactly."""

import copy
from dataclasses import dataclass, field
import json
from pathlib import Path
import signal
import sys
import threading
import time
from typing import Callable

import torch

from ..config import ConfigError, RunConfig, resolve_device, to_toml
from ..fileio import write_text
from ..model import LM, check_training_memory
from ..model.checkpoint import (CheckpointError, checkpoint_dir, load_state, load_weights, resume_dir, save_checkpoint,
                                weights_step)
from ..model.precision import autocast_for
from ..runinfo import environment, git_commit
from ..runs import absolute_root, check_run_corpus, open_training_corpus, run_config, run_meta, run_weights
from . import distributed
from .batches import Batches, sampling_record, train_batches
from .evaluated import drop_stale, keep_evaluated
from .metrics import MetricsLogger, read_metrics
from .optim import adamw, lr_at
from .step import NonFiniteLoss, train_step


class TrainingDiverged(RuntimeError):
    pass


class TrainingInterrupted(SystemExit):
    """SIGINT or SIGTERM stopped training after a checkpoint; exits with 128 + the signal number
    (130 for Ctrl-C) unless caught."""

    def __init__(self, signum: int, step: int):
        super().__init__(128 + signum)
        self.signum, self.step = signum, step


# meta.json's "validation_windows": what drew a run's validation windows. Runs begun before it was
# recorded drew them with train.seed and keep doing so when resumed (their val_loss stays one curve).
VALIDATION_DRAW = "eval.seed"


def validation_batches(cfg: RunConfig, corpus, info: distributed.DistInfo = distributed.DistInfo(),
                       seed: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The fixed validation windows ([rows, seq_len + 1], this rank's share) and, for
    train.documents=masked, their inputs' document ids (else None): train.val_batches global
    batches from the val split, drawn with eval.seed (default; `seed` overrides it), not the
    training seed: every method and every seed of a sweep is measured on the same tokens."""
    t = cfg.train
    seed = cfg.eval.seed if seed is None else seed
    starts = corpus.docs("val")[:, 0] if t.documents == "masked" else None
    val = Batches(corpus.tokens("val"), t.seq_len, t.batch_size, t.grad_accum, seed, info, split="val",
                  doc_starts=starts)
    return [(val.window(i, m), val.documents(i, m)) for i in range(cfg.train.val_batches) for m in range(t.grad_accum)]


def prepare_run_dir(run_dir: Path, resume: bool) -> Path | None:
    """Refuse to resume what is not a run or a damaged checkpoint, and to start a new run over one
    that has trained (a checkpoint, even a damaged one, or metrics). Returns the checkpoint to
    resume from (None: none written yet)."""
    run_dir = Path(run_dir)
    if resume:
        if not (run_dir / "config.toml").is_file():
            raise ConfigError(f"cannot resume: {run_dir} has no config.toml (is it a lenx run directory?)")
        return resume_dir(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if any((run_dir / d).exists() for d in ("ckpt", "ckpt.old")) or (metrics.exists() and metrics.stat().st_size):
        raise ConfigError(f"{run_dir} already holds a trained run; pass --resume to continue it or choose "
                          "another --out")
    return None


def train(cfg: RunConfig, run_dir: Path, resume: bool = False, progress: bool = True,
          stop_after: int | None = None, memory_check: bool = True, until: int | None = None) -> dict:
    """Train `cfg` into `run_dir`. With resume=True continue from the last checkpoint (the run's
    saved config is used). stop_after ends the loop after that many steps, `until` at that step
    (checkpointing first); a sharded corpus need hold only the shards of the steps up to there.
    memory_check: refuse, before the model is built, a step too large for the device.
    SIGINT / SIGTERM end it, checkpointed at the last finished step, with TrainingInterrupted: in a
    single process at once, abandoning a step still in its forward and backward passes; under
    torchrun after the current step (every rank stops at the same one).
    Under torchrun every rank calls this; the batch, loss curve and checkpoints are those of one
    process with the same global batch. Returns the run's step, its last training loss and
    validation loss (None when none was logged) and whether it finished."""
    run = setup_run(cfg, run_dir, resume, memory_check, stop_after, until)
    total = run.cfg.train.steps
    finished = run.start_step >= total  # resumed after its last step: nothing to train, nothing to write
    if finished and run.info.is_main:
        print(f"{run.run_dir} has already finished training (step {run.start_step} of {total}): nothing to resume",
              file=sys.stderr, flush=True)
    end = _end_step(run.cfg, run.start_step, stop_after, until)
    metrics = MetricsLogger(run.run_dir, run.cfg, run.metrics, run.start_step, end,
                            active=run.info.is_main and not finished, progress=progress)
    done, signum = run.start_step, None
    run.model.train()
    try:
        with StopSignals() as stop:
            for step in range(run.start_step, end):
                try:
                    loss, grad_norm = run_step(run, step, stop if not run.info.enabled else None)
                except StepAbandoned:
                    signum = stop.received
                    checkpoint_if_due(run, done, end, now=True)
                    break
                if step == run.start_step and run.info.is_main:
                    record_kernels(run.run_dir, run.raw_model.kernels())
                done = step + 1
                val_loss = validation_loss(run) if _validation_due(run.cfg, done) else None
                metrics.log(done, loss, lr_at(step, run.cfg), grad_norm, val_loss)
                signum = stop.agreed(run)
                checkpoint_if_due(run, done, end, now=signum is not None)
                if signum is not None:
                    break
    finally:
        metrics.close()
    if signum is not None and done < end:
        if run.info.is_main:
            print(f"interrupted by {signal.Signals(signum).name} at step {done} of {total}: checkpoint saved; "
                  f"continue with: lenx train --resume {run.run_dir}", file=sys.stderr, flush=True)
        raise TrainingInterrupted(signum, done)
    return {"run_dir": str(run.run_dir), "step": done, "final_loss": metrics.last_loss,
            "val_loss": metrics.last_val_loss, "finished": done >= total,
            "sampling": run.cfg.train.sampling, "epochs": sampling_record(run.cfg.train, run.corpus)["epochs"]}


def _end_step(cfg: RunConfig, start: int, stop_after: int | None, until: int | None) -> int:
    """Where this call of train() stops: train.steps, or earlier with stop_after or until."""
    end = cfg.train.steps if until is None else min(cfg.train.steps, until)
    return end if stop_after is None else min(end, start + stop_after)


class StepAbandoned(Exception):
    """A signal arrived while a step was still computing its gradients: the step is dropped, the
    model and optimizer are as the last finished step left them."""


class StopSignals:
    """While training runs, SIGINT and SIGTERM ask the loop to stop: at once while a step is in its
    forward and backward passes and `abandonable` (StepAbandoned: nothing has changed yet), else
    after the current step. A second SIGINT (Ctrl-C again) stops at once. A SIGTERM after the first
    signal is ignored: a launcher (torchrun, a parallel sweep) that passes a Ctrl-C on as SIGTERM
    must not cut the checkpoint short. Handlers can be installed in the main thread only: elsewhere
    signals keep their usual effect."""

    def __init__(self):
        self.received: int | None = None
        self.previous: dict = {}
        self.abandonable = False

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.getsignal(signum)
                signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        self._restore()

    def _restore(self):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self.previous = {}

    def _handle(self, signum, frame):
        if self.received is None:
            self.received = signum
            if self.abandonable:
                self.abandonable = False
                raise StepAbandoned
        elif signum == signal.SIGINT:
            self._restore()
            raise KeyboardInterrupt

    def agreed(self, run: "TrainingRun") -> int | None:
        """The signal any rank received (every rank calls this after the same step, so they stop together)."""
        if not run.info.enabled:
            return self.received
        import torch.distributed as dist

        flag = torch.tensor(self.received or 0, device=run.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag) or None


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
    corpus: object  # lenx.data.Corpus
    metrics: list[dict] = field(default_factory=list)  # the records metrics.jsonl held on resume
    val_windows: list[tuple] = field(default_factory=list)  # (window, document ids or None); empty: no validation


def setup_run(cfg: RunConfig | None, run_dir: Path, resume: bool, memory_check: bool = True,
              stop_after: int | None = None, until: int | None = None) -> TrainingRun:
    """Device and process group, corpus and the batches of the steps to train (train.py's stop_after
    and until), (memory_check) the step's memory, model, optimizer and (on resume) the checkpoint's
    weights, optimizer and RNG state; rank 0 writes config.toml and meta.json. Damage (a checkpoint
    folder without its state, a corrupt metrics line), data the steps cannot read (too few windows
    for a pass, an absent shard) or a step too large for the device is reported before anything is
    written."""
    run_dir = Path(run_dir)
    ckpt = prepare_run_dir(run_dir, resume)
    records = []
    if resume:
        cfg = run_config(run_dir)
        records = read_metrics(run_dir / "metrics.jsonl", notes=distributed.launched_info().is_main)
        if ckpt is None:
            _check_nothing_lost(run_dir, cfg, records)
    else:
        cfg = copy.deepcopy(cfg)
        cfg.data.root = absolute_root(cfg.data.root)  # the run opens from any working directory
        if cfg.train.init_from:
            cfg.train.init_from = str(Path(cfg.train.init_from).resolve())
    start_weights = run_weights(Path(cfg.train.init_from)) if cfg.train.init_from and ckpt is None else None
    device = resolve_device(cfg.train.device)
    info = distributed.setup(device.type)
    if device.type == "cuda" and info.enabled:
        device = torch.device("cuda", info.local_rank)
    with distributed.main_first(info):  # rank 0 builds the synthetic corpus if it is missing
        corpus = open_training_corpus(cfg)
    if resume:  # the run goes on with the data it began with, or not at all
        check_run_corpus(run_dir, cfg, corpus)
    cfg.model.vocab_size = corpus.vocab_size
    first = (weights_step(ckpt) or 0) if ckpt is not None else 0
    if until is not None and until <= first < cfg.train.steps:
        raise ConfigError(f"--until {until}: {run_dir} is at step {first} already; give a later step")
    batches = train_batches(cfg.train, corpus, info, first, _end_step(cfg, first, stop_after, until))
    if memory_check and first < cfg.train.steps:  # a finished run trains nothing
        # before the model takes any memory; a length warm-up's shorter steps hold as many tokens
        check_training_memory(cfg, device, info.world)
    torch.manual_seed(cfg.train.seed)
    raw_model = LM(cfg.model)
    # Full weights go into the plain model before it is wrapped or sharded, so any world size can
    # resume any checkpoint.
    state = None
    if ckpt is not None:
        load_weights(raw_model, ckpt)
        state = load_state(ckpt)
    elif start_weights is not None:  # fine-tuning: the optimizer and the schedule start afresh
        load_weights(raw_model, start_weights)
    if ckpt is None and resume and info.is_main:
        print(f"no checkpoint in {run_dir} yet: starting from step 0")
    start_step = state["step"] if state is not None else 0
    raw_model.to(device)
    model = distributed.parallelize(raw_model, cfg.train.parallel, info)
    optimizer = adamw(model, cfg.train, device)
    if state is not None:
        distributed.load_optimizer_state(model, optimizer, state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        if device.type == "cuda" and "cuda" in state["rng"]:
            torch.cuda.set_rng_state(state["rng"]["cuda"])
    step_fn = torch.compile(model) if cfg.train.compile else model
    val_seed = None
    if resume and run_meta(run_dir).get("validation_windows") != VALIDATION_DRAW:
        val_seed = cfg.train.seed  # begun before validation was fixed by eval.seed: the same windows as then
    val_windows = validation_batches(cfg, corpus, info, val_seed) if cfg.train.val_every else []
    if info.is_main and start_step < cfg.train.steps:  # a finished run resumes nothing, so records no resume
        _write_run_files(run_dir, cfg, device, info, raw_model, corpus, start_step if resume else None)
    return TrainingRun(cfg, run_dir, device, info, raw_model, model, step_fn, optimizer, batches, start_step,
                       corpus, records, val_windows)


def _check_nothing_lost(run_dir: Path, cfg: RunConfig, records: list[dict]) -> None:
    """A run with no checkpoint folder starts again from step 0, unless its metrics show it got
    past its first checkpoint: then the checkpoint was removed, and starting over would train over
    the record of the steps it took."""
    first = cfg.train.ckpt_every
    if cfg.train.keep_every:
        first = min(first, cfg.train.keep_every)
    last = max((r["step"] for r in records), default=0)
    if last > first:
        raise CheckpointError(
            f"{run_dir} has no checkpoint although metrics.jsonl records {last} steps (was ckpt/ removed?); "
            f"it cannot resume; to train again, start a new run: lenx train -c {run_dir / 'config.toml'} -o NEW_DIR")


def _write_run_files(run_dir: Path, cfg: RunConfig, device, info, raw_model: LM, corpus,
                     resumed_at: int | None) -> None:
    """config.toml, and meta.json: written when the run starts; a resume keeps its original
    environment and command and adds an entry to its "resumes" list. meta.json pins the corpus:
    its fingerprint (lenx.data.Corpus.fingerprint) and when it was prepared, which evaluation and
    generation check (lenx.runs.check_run_corpus); and it says how the run reads it: train.sampling
    and the passes its train.steps make over the train split (lenx.training.batches.sampling_record)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text(run_dir / "config.toml", to_toml(cfg))
    meta = run_meta(run_dir) if resumed_at is not None else {}
    if not meta:  # a new run, or meta.json missing or torn: this resume writes it anew
        masked = cfg.train.documents == "masked"  # every call carries document ids: the plan knows
        meta = {"environment": environment(device), "world_size": info.world, "parallel": cfg.train.parallel,
                "backends": raw_model.backends(device, masked), "params": raw_model.num_params(),
                "layers": raw_model.layout(),  # each layer's method and window (model.layers)
                "corpus": corpus.name, "vocab_size": corpus.vocab_size,
                "corpus_fingerprint": corpus.fingerprint(), "corpus_prepared": corpus.manifest.get("created"),
                "validation_windows": VALIDATION_DRAW}
        if raw_model.backend_notes(device, masked):  # a mask keeps a layer off the fused kernels: say so
            meta["backend_notes"] = raw_model.backend_notes(device, masked)
    meta.update(sampling_record(cfg.train, corpus))  # again on resume: config.toml's train.steps may have changed
    if resumed_at is not None:
        meta.setdefault("resumes", []).append({
            "step": resumed_at, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv),
            "git_commit": git_commit(), "world_size": info.world, "parallel": cfg.train.parallel})
    write_text(run_dir / "meta.json", json.dumps(meta, indent=2))


def record_kernels(run_dir: Path, kernels: list[str | None]) -> None:
    """meta.json's "kernels": the fused kernel each layer ran in the first step of the run (and of
    each resume, in its "resumes" entry), where one ran."""
    meta = run_meta(run_dir)
    if not any(kernels) or not meta:
        return
    entry = meta["resumes"][-1] if meta.get("resumes") else meta
    entry["kernels"] = kernels
    write_text(run_dir / "meta.json", json.dumps(meta, indent=2))


def run_step(run: TrainingRun, step: int, stop: StopSignals | None = None) -> tuple[float, torch.Tensor]:
    """Optimizer step `step` (from 0) over train.grad_accum micro-batches, at its learning rate.
    Returns the loss (the mean over ranks) and the gradient norm before clipping; raises
    TrainingDiverged on a non-finite loss, before the optimizer can apply it. With `stop`, a signal
    during the forward and backward passes abandons the step (StepAbandoned): the gradients are
    dropped and the RNG state is put back as it was before the step, so a checkpoint then is that of
    the last finished step."""
    cfg, device = run.cfg, run.device
    for group in run.optimizer.param_groups:
        group["lr"] = lr_at(step, cfg)
    batches = [run.batches.get(step, micro, device) for micro in range(cfg.train.grad_accum)]
    rng = _rng_state(device) if stop is not None else None
    if stop is not None:
        stop.abandonable = True

    def before_update():
        if stop is not None:
            stop.abandonable = False

    try:
        loss, grad_norm = train_step(
            run.model, run.optimizer, batches, lambda x, y, *ids: run.step_fn(x, y, *ids)[1], clip=cfg.train.grad_clip,
            autocast=lambda: autocast_for(device, cfg.train.precision),
            grad_sync=lambda last: distributed.grad_sync(run.model, cfg.train.parallel, run.info, last),
            reduce=lambda loss: distributed.mean_across_ranks(loss, run.info), check_finite=True,
            before_update=before_update)
    except StepAbandoned:
        run.optimizer.zero_grad(set_to_none=True)
        _set_rng_state(rng, device)
        raise
    except NonFiniteLoss as e:
        last = checkpoint_dir(run.run_dir)
        raise TrainingDiverged(
            f"loss became {e.loss} at step {step + 1}; stopped without saving. Last good checkpoint: "
            f"{last if last else 'none'} (lower train.lr or check the data)") from None
    return float(loss), grad_norm


def _validation_due(cfg: RunConfig, done: int) -> bool:
    every = cfg.train.val_every
    return bool(every) and (done % every == 0 or done == cfg.train.steps)


def validation_loss(run: TrainingRun) -> float:
    """Mean loss over the fixed validation batches (the mean over ranks), in eval mode and with the
    RNG state restored afterwards, so training reads the same random numbers with or without it."""
    devices = [run.device] if run.device.type == "cuda" else []
    total = torch.zeros((), device=run.device)
    run.model.eval()
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            for window, ids in run.val_windows:
                window = window.to(run.device)
                ids = None if ids is None else ids.to(run.device)
                with autocast_for(run.device, run.cfg.train.precision):
                    _, loss = run.model(window[:, :-1], window[:, 1:], ids)
                total += loss.float()
    finally:
        run.model.train()
    return float(distributed.mean_across_ranks(total / len(run.val_windows), run.info))


def checkpoint_if_due(run: TrainingRun, done: int, end: int, now: bool = False) -> None:
    """Every train.ckpt_every and train.keep_every steps, at the last step and when `now`: full
    weights and optimizer state, written by rank 0 alone (atomically, see model/checkpoint.py); the
    other ranks wait so that none runs ahead of a checkpoint that may yet fail. The checkpoint it
    replaces is kept, with its evaluations, where it was evaluated (lenx.training.evaluated)."""
    keep_every = run.cfg.train.keep_every
    keep = bool(keep_every) and done % keep_every == 0
    if not (now or keep or done % run.cfg.train.ckpt_every == 0 or done == end):
        return
    weights, optim_state = distributed.full_state(run.model, run.optimizer, run.cfg.train.parallel, run.info)
    if run.info.is_main:
        plain = run.raw_model
        if weights is not None:  # FSDP2: raw_model holds shards; rebuild a plain copy from the gathered state
            with torch.random.fork_rng(devices=[]):  # building a model must not move the saved RNG state
                plain = LM(run.cfg.model)
            distributed.match_shapes(weights, optim_state, {n: p.shape for n, p in plain.named_parameters()})
            plain.load_state_dict(weights)
        keep_evaluated(run.run_dir, done)
        save_checkpoint(run.run_dir, plain, _train_state(done, optim_state, run.device), keep=keep)
        drop_stale(run.run_dir, done)
    distributed.barrier(run.info)


def _rng_state(device) -> dict:
    rng = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return rng


def _set_rng_state(rng: dict, device) -> None:
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)


def _train_state(step, optim_state, device) -> dict:
    return {"step": step, "optimizer": optim_state, "rng": _rng_state(device)}
