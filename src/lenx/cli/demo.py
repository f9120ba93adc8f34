"""`lenx demo`: rope, kerple and dapev2-kerple on the synthetic corpus (the main job)."""

from pathlib import Path
from typing import Optional

import typer

from . import ProgressOpt, _command, _fail, _progress, _user_errors


@_command()
def demo(out: Path = typer.Option(Path("runs/demo"), "--out", "-o"),
         steps: int = typer.Option(300, help="training steps per method"),
         progress: Optional[bool] = ProgressOpt):
    """Compare rope, kerple and dapev2-kerple on the synthetic corpus (CPU, minutes).

    The main job: each method trains at length 64 and is evaluated up to 8x that; the table and the
    plot paths are printed.
    """
    from ..config import ConfigError, load_config
    from ..report.eval_tables import eval_table
    from ..report.tables import show
    from ..training.loop import TrainingDiverged
    from ..training.sweep import SweepError, sweep

    try:
        if steps < 1:  # checked here, so the message names the option the user gave
            raise ConfigError(f"--steps must be >= 1, got {steps}")
        cfg = load_config("tiny", [f"train.steps={steps}"])
        result = sweep(["rope", "kerple", "dapev2-kerple"], cfg, out, progress=_progress(progress))
    except _user_errors(TrainingDiverged, SweepError) as e:
        _fail(e)
    show([eval_table(result["results"])])
    print(f"table: {out / 'results.md'}")
    print("figures: " + ", ".join(result["figures"]))
