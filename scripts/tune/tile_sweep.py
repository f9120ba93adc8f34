"""Tile sweep of the fused kernels: each candidate launch setting is checked against the op's
reference (fp32, at --check-t) and timed forward and forward+backward at --t (bf16, B 1), beside
fused SDPA in the same run. Candidates are passed to the kernels as arguments (their `config`); no
kernel default is changed: copy a winner into the kernel's CONFIG / TILES by hand.

Usage (repository root, CUDA machine):
  PYTHONPATH=src python3 scripts/tune/tile_sweep.py --op biased --candidates '[{}, {"dq": [64, 64, 4, 3]}]' -o out.json
  ops: biased (Kerple table), stickbreaking, dapev2 (Kerple table, k 3, D 32)
"""

import argparse
import json

import torch

from lenx.bench.kernels import median_ms
from lenx.runinfo import environment

DEFAULTS = {
    "biased": [{}, {"dq": [64, 64, 4, 3]}],
    "stickbreaking": [{}, {"fwd": [64, 64, 4, 3]}, {"bwd": [128, 64, 8, 2]}, {"scan": ["mm"]}],
    "dapev2": [{}, {"tiles": [16, 16, 8, 1]}],
}


def make_case(op: str, H: int, d: int, T: int, dtype, config: dict):
    """(fn(q, k, v) -> out, reference(q, k, v) -> out, parameters that get gradients)."""
    from lenx.attention import KerpleLog

    dev = torch.device("cuda")
    torch.manual_seed(0)
    if op == "stickbreaking":
        from lenx.ops.stickbreaking.reference import stickbreaking_reference
        from lenx.ops.stickbreaking.triton import stickbreaking_triton

        return (lambda q, k, v: stickbreaking_triton(q, k, v, config=config)[0],
                lambda q, k, v: stickbreaking_reference(q, k, v)[0], [])
    bias = KerpleLog(H).to(dev)
    if op == "biased":
        from lenx.ops.biased_softmax.reference import biased_softmax_reference
        from lenx.ops.biased_softmax.triton import biased_attention

        return (lambda q, k, v: biased_attention(q, k, v, bias.table(T, dev), **bias.fused_grad_args(), config=config),
                lambda q, k, v: biased_softmax_reference(q, k, v, bias.table(T, dev)), [bias.r1, bias.r2])
    from lenx.attention import DapeV2
    from lenx.ops.dape_v2.reference import dape_v2_reference
    from lenx.ops.dape_v2.triton import dape_v2_triton

    proc = DapeV2(H, 32, 3).to(dev)
    w = proc.conv_weights()
    return (lambda q, k, v: dape_v2_triton(q, k, v, *w, bias.table(T, dev), config=config),
            lambda q, k, v: dape_v2_reference(q, k, v, *w, bias.table(T, dev)), [bias.r1, bias.r2, *w])


def check(op, config, T, H, d) -> float:
    """Largest relative error of out, dq, dk, dv (bf16 kernel vs fp32 reference)."""
    fn, ref_fn, _ = make_case(op, H, d, T, torch.bfloat16, config)
    q, k, v = (torch.randn(1, H, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(1, H, T, d, device="cuda")
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), g.bfloat16())
    refs = [x.detach().float().requires_grad_() for x in (q, k, v)]
    ref = ref_fn(*refs)
    ref_grads = torch.autograd.grad(ref, refs, g)
    return max(float((a.float() - b).norm() / b.norm()) for a, b in zip((out, *grads), (ref, *ref_grads)))


def time_case(op, config, T, H, d) -> dict:
    fn, _, params = make_case(op, H, d, T, torch.bfloat16, config)
    q, k, v = (torch.randn(1, H, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn_like(q)
    with torch.no_grad():
        fwd = median_ms(lambda: fn(q, k, v), 25, 200, 30)[0]
    fwdbwd = median_ms(lambda: fn(q, k, v).backward(g), 25, 200, 30, [q, k, v, *params])[0]
    return {"fwd_ms": fwd, "fwdbwd_ms": fwdbwd}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", choices=sorted(DEFAULTS), required=True)
    p.add_argument("--candidates", help="JSON list of launch settings (default: a few per op)")
    p.add_argument("--t", type=int, default=8192)
    p.add_argument("--check-t", type=int, default=1024)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("-o", "--out", required=True)
    a = p.parse_args()
    cands = json.loads(a.candidates) if a.candidates else DEFAULTS[a.op]
    q, k, v = (torch.randn(1, a.heads, a.t, a.head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    with torch.no_grad():
        sdpa_fwd = median_ms(sdpa, 25, 200, 50)[0]
    sdpa_fb = median_ms(lambda: sdpa().backward(torch.ones_like(q)), 25, 200, 50, [q, k, v])[0]
    result = {"environment": environment(torch.device("cuda")), "op": a.op, "T": a.t, "check_T": a.check_t,
              "sdpa": {"fwd_ms": sdpa_fwd, "fwdbwd_ms": sdpa_fb}, "rows": []}
    for cand in cands:
        row = {"config": cand}
        try:
            row["check_err"] = check(a.op, cand, a.check_t, a.heads, a.head_dim)
            if row["check_err"] < 1e-2:
                row.update(time_case(a.op, cand, a.t, a.heads, a.head_dim))
        except Exception as err:  # noqa: BLE001  (a candidate that does not fit is a result)
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        torch.cuda.empty_cache()
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
