"""Decoding speed with the KV cache: a `preset` model (random weights: the speed does not depend on
them) per method reads a prompt of C - N tokens (prefill, the planner's backends) and then decodes
N tokens one at a time (batch 1, bf16 autocast). Reports the prefill time and decoded tokens/s.

Usage (repository root, CUDA machine):
  PYTHONPATH=src python3 scripts/device/decode_speed.py --contexts 1024,8192,32768 -o decode_speed.json
"""

import argparse
import json
import time

import torch

from lenx.config import load_config
from lenx.model import LM
from lenx.runinfo import environment


def measure(method: str, preset: str, context: int, new: int, device) -> dict:
    cfg = load_config(preset, [f"model.method={method}"])
    cfg.model.vocab_size = 16384
    torch.manual_seed(0)
    model = LM(cfg.model).to(device).eval()
    prompt = torch.randint(0, 16384, (1, context - new), device=device)
    row = {"method": method, "context": context, "new_tokens": new, "backends": model.backends(device)}
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for attempt in ("warmup", "timed"):
            cache = model.new_cache(1, context, device, torch.bfloat16)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            logits = model.prefill(prompt, cache)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            steps = new if attempt == "timed" else 4
            for _ in range(steps):
                logits = model.decode(logits.argmax(-1, keepdim=True), cache)[:, -1]
            torch.cuda.synchronize()
            t2 = time.perf_counter()
    row.update(prefill_s=t1 - t0, decode_s=t2 - t1, tokens_per_s=new / (t2 - t1), ms_per_token=1000 * (t2 - t1) / new,
               peak_gib=torch.cuda.max_memory_allocated() / 2**30)
    del model, cache
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default="rope,kerple,dapev2-kerple,stickbreaking")
    p.add_argument("--contexts", default="1024,8192,32768")
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--preset", default="125m")
    p.add_argument("-o", "--out", required=True)
    a = p.parse_args()
    device = torch.device("cuda")
    result = {"environment": environment(device), "preset": a.preset, "batch": 1, "rows": []}
    for context in map(int, a.contexts.split(",")):
        for method in a.methods.split(","):
            try:
                row = measure(method, a.preset, context, a.new, device)
            except torch.OutOfMemoryError as err:
                row = {"method": method, "context": context, "error": str(err).splitlines()[0]}
            result["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "backends"}), flush=True)
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
