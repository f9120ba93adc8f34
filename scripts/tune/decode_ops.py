"""The operators of one fixed-shape decode step (LM.static_step, what `lenx generate`'s CUDA graph and
`lenx bench --decode`'s graph rows replay), counted on the CPU, per method: in total and per layer
(the difference between a model of --layers + 1 layers and one of --layers), in fp32 and under bf16
autocast (the GPU's precision: the step then runs a copy with bf16 matmul weights), with a bf16 cache.

Two counts: "kernels", the non-view aten ops dispatched below autograd (TorchDispatchMode: a view
launches no kernel; each of the others is about one kernel on a GPU, whose decode step at batch 1 is
launch-bound), and "profiler", the top-level aten ops torch.profiler records (composite ops
counted once, their parts not). Deterministic for a given torch; no timing.

    PYTHONPATH=src python scripts/tune/decode_ops.py --methods rope,kerple --layers 1 --ops
"""

import argparse
from collections import Counter
from dataclasses import replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lenx.config import load_config
from lenx.model import LM
from lenx.model.decoding import StaticDecoder


class Dispatched(TorchDispatchMode):
    """Every aten op dispatched while it is on, views apart."""

    def __init__(self):
        super().__init__()
        self.kernels: list[str] = []
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.is_view or func._opname in ("view", "_unsafe_view", "alias"):
            self.views += 1
        else:
            self.kernels.append(str(func).removeprefix("aten."))
        return func(*args, **(kwargs or {}))


def step_decoder(method: str, n_layer: int, bf16: bool, preset: str = "125m", context: int = 64, batch: int = 2):
    """A StaticDecoder of a `preset`-shaped model of n_layer layers (vocabulary 512) on a cache of a
    left-padded batch, after one untimed step."""
    cfg = load_config(preset, [f"model.n_layer={n_layer}", f"model.method={method!r}"]).model
    torch.manual_seed(0)
    model = LM(replace(cfg, vocab_size=512)).eval()
    dtype = torch.bfloat16 if bf16 else None
    cache = model.new_cache(batch, context + 8, dtype=dtype)
    prompt = torch.randint(0, 512, (batch, context))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        model.prefill(prompt, cache, [context - b for b in range(batch)])
    decoder = StaticDecoder(model, cache, "static", dtype)
    decoder(torch.zeros(batch, dtype=torch.long))
    return decoder


def count(method: str, n_layer: int, bf16: bool, **kwargs) -> dict:
    """{"kernels": [op names], "views": n, "profiler": n} of one step."""
    from torch.profiler import ProfilerActivity, profile

    decoder = step_decoder(method, n_layer, bf16, **kwargs)
    token = torch.zeros(decoder.cache.batch, dtype=torch.long)
    with Dispatched() as seen:
        decoder(token)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        decoder(token)
    top = [e for e in prof.events() if e.name.startswith("aten::")
           and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    return {"kernels": seen.kernels, "views": seen.views, "profiler": len(top)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="rope,kerple")
    ap.add_argument("--layers", type=int, default=1, help="the smaller model's layers (the other has one more)")
    ap.add_argument("--preset", default="125m")
    ap.add_argument("--ops", action="store_true", help="also list one layer's kernels by name")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"| method | precision | kernels / step ({args.layers} layers) | kernels / layer | profiler ops / layer | views / layer |")
    print("|---|---|---|---|---|---|")
    for method in args.methods.split(","):
        for bf16 in (False, True):
            small = count(method, args.layers, bf16, preset=args.preset)
            big = count(method, args.layers + 1, bf16, preset=args.preset)
            per_layer = len(big["kernels"]) - len(small["kernels"])
            print(f"| {method} | {'bf16 autocast' if bf16 else 'fp32'} | {len(small['kernels'])} | {per_layer} | "
                  f"{big['profiler'] - small['profiler']} | {big['views'] - small['views']} |")
            if args.ops:
                layer = Counter(big["kernels"]) - Counter(small["kernels"])
                print("|", method, "| layer:", ", ".join(f"{name} {n}" for name, n in sorted(layer.items())), "| | | | |")


if __name__ == "__main__":
    main()
