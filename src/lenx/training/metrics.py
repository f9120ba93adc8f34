"""A run's metrics: metrics.jsonl (read back on resume, and by lenx sweep for its loss curves),
TensorBoard scalars and the progress bar."""

import json
from pathlib import Path
import sys
import time

import torch

from ..model.checkpoint import CheckpointError
from ..config import RunConfig
from ..fileio import write_text
from .batches import seq_len_at


def read_metrics(path: Path, notes: bool = True) -> list[dict]:
    """The records of a metrics.jsonl. A last line cut short (a kill during an append) is dropped
    (with a note on stderr if `notes`); a bad line elsewhere is damage, a one-line CheckpointError."""
    if not path.exists():
        return []
    lines = path.read_text(errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("no step")
        except ValueError as e:  # json.JSONDecodeError included
            if number == len(lines):
                if notes:
                    print(f"note: dropped the half-written last line of {path} (the run stopped while writing it)",
                          file=sys.stderr)
                break
            raise CheckpointError(f"{path} line {number} is not a metrics record ({e}); repair or delete that line "
                                  "and resume again") from None
        records.append(record)
    return records


class MetricsLogger:
    """metrics.jsonl, TensorBoard scalars and a progress bar of the run in `run_dir`, kept by one
    process (`active`; under torchrun rank 0): elsewhere every method does nothing. `records` are
    what metrics.jsonl held when the run (re)started at `start_step`; the loop ends at `end`. A
    record is written every train.log_every steps, at the last and with every validation loss."""

    def __init__(self, run_dir: Path, cfg: RunConfig, records: list[dict], start_step: int, end: int, *,
                 active: bool, progress: bool):
        self.active = active
        self.end, self.last_logged = end, start_step
        self.log_every = cfg.train.log_every
        self.tokens_per_step = cfg.train.batch_size * cfg.train.seq_len
        self.train = cfg.train  # a length warm-up's records carry the length of their step
        self.path = run_dir / "metrics.jsonl"
        # On resume, the records after the checkpoint go: the steps they describe are taken again.
        kept = [r for r in records if r["step"] <= start_step]
        self.last_loss = kept[-1].get("loss") if kept else None
        self.last_val_loss = next((r["val_loss"] for r in reversed(kept) if "val_loss" in r), None)
        self.writer = self.bar = None
        if self.active:
            if self.path.exists():
                write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
            self.writer = _tensorboard(run_dir, start_step)
            if progress:
                from tqdm import tqdm

                self.bar = tqdm(total=cfg.train.steps, initial=start_step, desc=cfg.model.label,
                                unit="step", dynamic_ncols=True)
        self.t_last = time.perf_counter()

    def log(self, done: int, loss: float, lr: float, grad_norm: torch.Tensor, val_loss: float | None = None) -> None:
        """After step `done` (1-based) has been taken."""
        self.last_loss = loss
        if val_loss is not None:
            self.last_val_loss = val_loss
        if not self.active:
            return
        if done % self.log_every == 0 or done == self.end or val_loss is not None:
            now = time.perf_counter()
            record = {"step": done, "loss": loss, "lr": lr, "grad_norm": float(grad_norm),
                      "tokens_per_s": self.tokens_per_step * (done - self.last_logged) / max(now - self.t_last, 1e-9),
                      "time": time.time()}
            if self.train.seq_len_warmup:
                record["seq_len"] = seq_len_at(self.train, done - 1)
            if val_loss is not None:
                record["val_loss"] = val_loss
            self.t_last, self.last_logged = now, done
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
            if self.writer is not None:
                for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
                    self.writer.add_scalar(f"train/{key}", record[key], done)
                if val_loss is not None:
                    self.writer.add_scalar("val/loss", val_loss, done)
            if self.bar is not None:
                self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()


def _tensorboard(run_dir: Path, start_step: int):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    # purge_step: TensorBoard drops the events a killed run logged after its checkpoint
    return SummaryWriter(str(run_dir / "tb"), purge_step=start_step)
