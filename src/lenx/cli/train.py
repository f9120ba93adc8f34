"""`lenx train`: one run, on one device or under torchrun on several GPUs."""

import json
from pathlib import Path
import re
from typing import Optional

import typer

from . import (ConfigOpt, NoMemoryCheckOpt, ProgressOpt, SetOpt, _command, _fail, _progress, _run_config,
               _user_errors)


@_command("train")
def train_cmd(ctx: typer.Context, config: str = ConfigOpt, set_: list[str] = SetOpt,
              out: Path = typer.Option(None, "--out", "-o",
                                       help="run directory (default runs/<corpus>-<method or layout>-T<len>)"),
              resume: Path = typer.Option(None, "--resume", help="continue this run directory from its last checkpoint"),
              until: Optional[int] = typer.Option(None, "--until", min=1,
                                                  help="stop at this step, checkpointed (continue later with --resume); "
                                                       "with train.sampling=\"pass\" over a sharded corpus, only the "
                                                       "shards of the steps up to it need be here"),
              progress: Optional[bool] = ProgressOpt, no_memory_check: bool = NoMemoryCheckOpt):
    """Train a model, on one device or under torchrun on several GPUs.

    Several GPUs: `torchrun --nproc-per-node N -m lenx train ...` (DDP by default,
    `--set train.parallel=fsdp` for FSDP2).

    A machine held for a while trains part of a run: `--until STEP` stops there with a checkpoint, and
    `lenx train --resume RUN` continues on another one; with train.sampling="pass" over a sharded
    corpus (`lenx shard`) each machine needs only the shards of its steps
    (scripts/data/shards_for_steps.py lists them).

    Before the first step, the step's peak memory is estimated (weights, gradients, optimizer state,
    activations, the attention backend's own memory) and a run that would not fit the device is
    refused; --no-memory-check trains anyway.
    """
    from ..config import ConfigError, load_config
    from ..fileio import check_writable_dir
    from ..model import check_device
    from ..training import distributed
    from ..training.loop import TrainingDiverged, train

    # Under torchrun a failing rank reports its error and exits non-zero; torchrun then stops the
    # other ranks, which may be waiting for it in a collective. The process group is shut down only
    # after success: shutting NCCL down can itself wait for peers, and exiting frees it anyway.
    try:
        if resume is not None:  # the options it would ignore are errors, rather than ignored silently
            if set_:
                raise ConfigError("--resume continues the run with its saved config.toml; --set cannot change it "
                                  f"(edit {resume / 'config.toml'} instead, e.g. train.parallel)")
            if ctx.get_parameter_source("config").name == "COMMANDLINE":  # -c given, even as the default tiny
                raise ConfigError("--resume continues the run with its saved config.toml; -c/--config cannot replace "
                                  f"it (edit {resume / 'config.toml'} instead, or train a new run without --resume)")
            if out is not None:
                raise ConfigError(f"--resume continues the run in its own folder, {resume}; -o/--out cannot move it "
                                  "(copy the folder and resume the copy instead)")
            resumed = _run_config(resume)
            check_device(resumed, resumed.train.device)
            check_writable_dir(resume, "the run folder")
            summary = train(None, resume, resume=True, progress=_progress(progress), memory_check=not no_memory_check,
                            until=until)
        else:
            cfg = load_config(config, set_ or [])
            check_device(cfg, cfg.train.device)
            name = re.sub(r"[^\w.-]+", "_", cfg.model.label)  # a layout: no , * ( :
            run_dir = out or Path("runs") / f"{cfg.data.corpus}-{name}-T{cfg.train.seq_len}"
            check_writable_dir(run_dir, "--out" if out else "the run folder")
            summary = train(cfg, run_dir, progress=_progress(progress), memory_check=not no_memory_check, until=until)
    except _user_errors(TrainingDiverged) as e:
        _fail(e)
    distributed.teardown()
    if distributed.launched_info().is_main:
        print(json.dumps(summary))
