"""How long one cell of the synthetic suite takes at long context: a 125m model (random weights: the
time does not depend on them) of each method scores `--samples` inputs of one task at one length
and depth (a teacher-forced forward for the answer's log-probability, then greedy KV-cache
generation), on the `code` corpus's test split. Prints and writes JSON with the GPU and versions.

    PYTHONPATH=src python3 scripts/tune/time_suite_cell.py OUT.json --methods kerple,rope --length 16384
"""

import argparse
import json
import time

import torch

from lenx.config import load_config
from lenx.data.corpus import open_corpus
from lenx.evaluation.suite import run_suite
from lenx.model import LM
from lenx.model.precision import autocast_for
from lenx.runinfo import environment


def time_cell(method: str, corpus, task: str, length: int, samples: int, device, preset: str) -> dict:
    cfg = load_config(preset, [f"model.method={method}", "data.corpus=code", f"model.vocab_size={corpus.vocab_size}"])
    torch.manual_seed(0)
    model = LM(cfg.model).to(device).eval()
    autocast = lambda: autocast_for(device, cfg.train.precision)  # noqa: E731
    run_suite(model, corpus, [task], [length], [0.5], 1, device=device, autocast=autocast)  # warm-up (compiles)
    sync(device)
    start = time.perf_counter()
    run_suite(model, corpus, [task], [length], [0.5], samples, device=device, autocast=autocast)
    sync(device)
    seconds = time.perf_counter() - start
    return {"method": method, "task": task, "length": length, "samples": samples, "cell_s": round(seconds, 3),
            "per_input_s": round(seconds / samples, 4), "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--methods", default="kerple,rope,dapev2-kerple")
    p.add_argument("--task", default="niah_single")
    p.add_argument("--length", type=int, default=16384)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--preset", default="125m")
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    device = torch.device(args.device)
    corpus = open_corpus("code")
    rows = []
    for method in args.methods.split(","):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        rows.append(time_cell(method, corpus, args.task, args.length, args.samples, device, args.preset))
        print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "environment": environment(device)}, f, indent=1)


if __name__ == "__main__":
    main()
