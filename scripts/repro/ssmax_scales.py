"""SSMax's learned scales s_h of trained runs, per layer, as one JSON line per run on stdout (the job
log keeps it; checkpoints do not come back from the device): issue 42's check of whether the
initialisation (model.temp_ssmax_init) changes what is learned.

    python3 scripts/repro/ssmax_scales.py RUN [RUN ...]
"""

import json
import sys
from pathlib import Path

import torch

from lenx.attention.temperature import QueryTemperature
from lenx.model.checkpoint import CheckpointError
from lenx.runs import load_run


def scales(run: Path) -> dict:
    if not (run / "config.toml").is_file():
        raise ValueError(f"{run} is not a run folder (no config.toml)")
    model, cfg = load_run(run, torch.device("cpu"))
    layers = [m.s.detach().tolist() for m in model.modules() if isinstance(m, QueryTemperature) and m.s is not None]
    if not layers:
        raise ValueError(f"{run} has no SSMax scales (method {cfg.model.method!r})")
    return {"run": str(run), "init": cfg.model.temp_ssmax_init, "s": layers}


def main(args: list[str]) -> int:
    if not args:
        print("error: usage: python3 scripts/repro/ssmax_scales.py RUN [RUN ...]", file=sys.stderr)
        return 2
    try:
        rows = [scales(Path(arg)) for arg in args]  # every run read before anything is printed
    except (ValueError, OSError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
