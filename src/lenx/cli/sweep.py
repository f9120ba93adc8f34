"""`lenx sweep`: train and evaluate several methods on equal terms."""

from pathlib import Path
from typing import Optional

import typer

from . import (ConfigOpt, NoMemoryCheckOpt, ProgressOpt, SetOpt, _command, _fail, _parse_methods, _parse_seeds,
               _progress, _user_errors)


@_command("sweep")
def sweep_cmd(methods: str = typer.Option(..., help="comma-separated method names"), config: str = ConfigOpt,
              set_: list[str] = SetOpt, out: Path = typer.Option(None, "--out", "-o", help="sweep directory"),
              seeds: str = typer.Option(None, help="comma-separated training seeds, e.g. 0,1,2: every method is "
                                                   "trained once per seed (runs <out>/<method>-s<seed>) and the "
                                                   "table shows mean ± std (default: train.seed alone)"),
              jobs: int = typer.Option(1, "--jobs", "-j", min=0, help="runs at once, each in its own process "
                                       "(one GPU each via CUDA_VISIBLE_DEVICES; logs in <run>/sweep.log); "
                                       "0 = one per visible GPU"),
              force: bool = typer.Option(False, help="train and evaluate again the runs that are already done"),
              progress: Optional[bool] = ProgressOpt, no_memory_check: bool = NoMemoryCheckOpt):
    """Train and evaluate several methods on equal terms; print the table, draw the plots.

    Every method gets the same data, seed, token budget and evaluation windows; a finished run is
    not trained again and a partial one resumes. Every method's config, and that its training step
    fits the device's memory (--no-memory-check skips that), is checked before the first trains.
    Writes results.json, results.md and the figures.
    """
    from ..config import load_config
    from ..fileio import check_writable_dir
    from ..report.eval_tables import eval_table
    from ..report.tables import show
    from ..training.loop import TrainingDiverged
    from ..training.sweep import SweepError, sweep

    try:
        names = _parse_methods(methods)
        seed_list = _parse_seeds(seeds)
        cfg = load_config(config, set_ or [])  # sweep() checks every run's config before the first trains
        check_writable_dir(out or Path("runs") / f"sweep-{cfg.data.corpus}-T{cfg.train.seq_len}",
                           "--out" if out else "the sweep folder")
        out = out or Path("runs") / f"sweep-{cfg.data.corpus}-T{cfg.train.seq_len}"
        result = sweep(names, cfg, out, progress=_progress(progress), jobs=jobs, force=force, seeds=seed_list,
                       memory_check=not no_memory_check)
    except _user_errors(TrainingDiverged, SweepError) as e:
        _fail(e)
    show([eval_table(result["results"])])
    print("figures: " + ", ".join(result["figures"]))
