"""Session 4: a whole 125m training step of dapev2-kerple with each attention backend (the fused
kernel, the dense reference, the chunked path) at the training lengths, batch x length = 16384
tokens: which backend is fastest where, and at what memory.
Usage (repository root on a CUDA machine): PYTHONPATH=src python3 results/bench/dape_train_backends.py OUT.json"""
import json
import sys

import torch

from lenx.bench import train_step_bench

rows = []
for seq_len, batch in ((512, 32), (1024, 16), (2048, 8)):
    for backend in ("triton", "dense", "chunked"):
        res = train_step_bench(["dapev2-kerple"], preset="125m", seq_len=seq_len, batch_size=batch, steps=10,
                               warmup=3, device="cuda", backend_overrides={"dapev2-kerple": backend}, log=None)
        r = res["rows"][0]  # a failure (out of memory included) is a row with "error"
        row = {"seq_len": seq_len, "batch": batch, "backend": backend}
        row.update({k: r[k] for k in ("median_ms", "peak_gib", "final_loss", "backends", "error") if k in r})
        rows.append(row)
        print(row, flush=True)
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(sys.argv[1], "w"), indent=1)
