"""Where a decode step's time goes: one step of the --preset model (random weights, a cache already
holding `context` random tokens, keys and values, as `lenx bench --decode` sets it up) under
torch.profiler, in any of `lenx bench --decode`'s modes (eager: LM.decode; static: LM.static_step;
graph, compile: that step replayed as a CUDA graph / compiled), and optionally transformers' GPT-2 of
the same shape (--gpt2 MODES, as the bench builds it): the step's wall time, its kernels' summed
device time and count, and the top kernels and host ops. Wall far above the kernels' sum means the
step is bound by the host (launches, syncs); the top entries say which. Against GPT-2's compiled step,
the kernels' sum says which side does more GPU work.
Usage (repository root; CUDA machine, or a CPU with --device cpu):
  PYTHONPATH=src python3 scripts/device/decode_profile.py --methods rope,kerple --context 8192 -o OUT.json
"""

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from lenx.bench.decode import _gpt2, _gpt2_step, _lenx_step
from lenx.config import load_config
from lenx.model import LM


def one(method: str, preset: str, mode: str, context: int, device, steps: int = 3) -> dict:
    cfg = load_config(preset, [f"model.method='{method}'", "model.vocab_size=16384"])
    torch.manual_seed(0)
    if method == "gpt2":
        model = _gpt2(cfg.model, context + steps + 8, device)
        step = _gpt2_step(model, mode, context, 1, steps + 8, device, 16384)
    else:
        model = LM(cfg.model).to(device).eval()
        step = _lenx_step(model, mode, context, 1, steps + 8, device, 16384)
    token = torch.zeros(1, dtype=torch.long, device=device)
    for _ in range(3):
        token = step(token)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        token = step(token)
    sync()
    wall = 1000 * (time.perf_counter() - t0) / steps
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        token = step(token)
        sync()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    host = sorted(events, key=lambda e: -e.self_cpu_time_total)[:15]
    row = {"method": method, "mode": mode, "context": context, "wall_ms": wall,
           "kernel_ms": sum(e.self_device_time_total for e in kernels) / 1000,
           "kernel_launches": sum(e.count for e in kernels),
           "top_kernels": {e.key[:80]: [e.count, e.self_device_time_total / 1000]
                           for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:12]},
           "top_host_ops": {e.key[:80]: [e.count, e.self_cpu_time_total / 1000] for e in host}}
    print(json.dumps(row, indent=1), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="rope,kerple")
    ap.add_argument("--modes", default="eager,static")
    ap.add_argument("--gpt2", default="", help="GPT-2's modes to profile too (eager, compile), comma-separated")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--preset", default="125m")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    device = torch.device(a.device)
    runs = [(m, mode) for m in a.methods.split(",") for mode in a.modes.split(",")]
    runs += [("gpt2", mode) for mode in a.gpt2.split(",") if mode]
    rows = [one(m, a.preset, mode, a.context, device) for m, mode in runs]
    with open(a.out, "w") as f:
        json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name() if device.type == "cuda"
                   else "cpu", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
