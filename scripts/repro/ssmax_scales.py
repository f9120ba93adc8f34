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
from lenx.runs import load_run


def scales(run: Path) -> dict:
    model, cfg = load_run(run, torch.device("cpu"))
    layers = [m.s.detach().tolist() for m in model.modules() if isinstance(m, QueryTemperature) and m.s is not None]
    if not layers:
        raise SystemExit(f"error: {run} has no SSMax scales (method {cfg.model.method!r})")
    return {"run": str(run), "init": cfg.model.temp_ssmax_init, "s": layers}


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: python3 scripts/repro/ssmax_scales.py RUN [RUN ...]")
    for arg in sys.argv[1:]:
        print(json.dumps(scales(Path(arg))))
