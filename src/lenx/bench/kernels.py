"""Time and peak memory of the attention backends, per method and length (`lenx bench`).

For every method, backend and length: forward time (no autograd graph), forward+backward time, and
the peak memory of each (torch.cuda.max_memory_allocated after a reset, inputs included). Times
are per call, calls run back to back between two CUDA events after a warm-up (median of 5
batches); each row also records the median of calls timed one at a time (`*_synced_ms`). Ratios
are taken against fused causal SDPA measured in the same run. Out-of-memory is caught and recorded as such; a call slower
than `max_call_s` (median) skips the longer lengths of that (method, backend).

The triton backend's rows record `fwd_kernel`: its forward-only calls of DAPE V2 run the Gluon kernel
on sm_90 (attention/backends/fused.py), and the table then names it ("triton (gluon fwd)").

Library use: run_bench(...) -> dict (also written as JSON). Whole training steps per method (the
DAPE V2 paper's table 7): train_step_bench(...); `lenx bench --train-step`. Their tables:
lenx.report.bench_tables. Besides the wall time of a step it profiles a few more steps with
torch.profiler and reports GPU kernel time: of
the whole step, and of the attention's kernels (forward and backward, marked by
lenx.attention.profiling), with ratios against Kerple and SDPA. Wall times also count the host
launching the kernels (host-bound where kernels are short, as the attention's are at training
shapes), so the kernel times are the figures that compare the attention methods' GPU cost.
Tile sweeps and kernel probes are lab-bench scripts: scripts/tune/.
"""

from dataclasses import replace
import gc
import json
import platform
import statistics
import sys
import time
import warnings

import torch

from ..attention import Attention, AttentionConfig
from ..attention.backends import run_backend, unsupported_reason

METHODS = ("sdpa", "kerple", "dapev2-kerple", "stickbreaking")
BACKENDS = ("sdpa", "flex", "triton", "chunked", "dense")
LENGTHS = (512, 2048, 8192, 16384, 32768)


def _parts(method: str, heads: int, head_dim: int, device, dape_hidden: int, dape_kernel: int):
    """The attention parts of a lenx method ("sdpa" = plain causal softmax, lenx's "nope")."""
    name = "nope" if method == "sdpa" else method
    cfg = AttentionConfig(method=name, backend="dense", dape_hidden=dape_hidden, dape_kernel=dape_kernel,
                          sb_remainder="drop")
    module = Attention(cfg, heads, heads * head_dim).to(device)
    return module.parts, [p for n, p in module.named_parameters() if not n.startswith(("qkv", "proj"))]


def median_ms(fn, warmup_ms: float, rep_ms: float, max_reps: int, grads_to_none=()):
    """Time of one fn() in ms -> (back-to-back ms, reps, first-call ms, synchronized-call ms).

    Back to back (the figure the ratios use, as triton.testing.do_bench and the flash-attention
    benchmarks time): n calls between two CUDA events, no synchronisation in between, so the CPU
    queues the next call while the GPU runs this one, as in training or evaluation; the median of
    5 such batches, over n. Synchronized: the median of calls each timed alone and waited for,
    which also counts the launch latency of every small op (a bias table built per call, say)."""
    def run():
        for t in grads_to_none:
            t.grad = None
        fn()

    def timed(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            run()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / n

    first = timed(1)
    spent, n = first, 0
    while spent < warmup_ms and n < max_reps:
        spent += timed(1)
        n += 1
    synced = []
    while len(synced) < 3 or (sum(synced) < rep_ms / 2 and len(synced) < max_reps):
        synced.append(timed(1))
    per_call = statistics.median(synced)
    n = max(1, min(max_reps, int(rep_ms / 2 / 5 / max(per_call, 1e-3))))
    batches = [timed(n) for _ in range(5)]
    return statistics.median(batches), 5 * n, first, per_call


def _is_oom(err: Exception) -> bool:
    text = f"{type(err).__name__}: {err}".lower()
    return isinstance(err, torch.cuda.OutOfMemoryError) or any(
        s in text for s in ("out of memory", "outofresources", "out of resource"))


def _measure(method, backend, T, *, batch, heads, head_dim, dtype, device, chunk_size, dape_hidden, dape_kernel,
             warmup_ms, rep_ms, max_reps):
    """One row: fwd / fwd+bwd time and peak memory. Raises on anything but OOM."""
    torch.manual_seed(0)
    parts, params = _parts(method, heads, head_dim, device, dape_hidden, dape_kernel)
    row = {"method": method, "backend": backend, "T": T}
    reason = unsupported_reason(backend, parts, device)
    if reason:
        row["status"] = f"unsupported: {reason}"
        return row
    shape = (batch, heads, T, head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    g = torch.randn(shape, device=device, dtype=dtype)
    leaves = [q, k, v] + params
    if backend == "triton":  # forward-only DAPE V2 work may run the Gluon kernel (fused._use_gluon)
        from ..attention.backends.fused import forward_kernel

        with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
            row["fwd_kernel"] = forward_kernel(q, k, v, parts)

    def fwd():
        # autocast as in mixed-precision training: the dense/chunked paths' convs and matmuls run
        # in bf16 with fp32 parameters (the fused paths take the bf16 inputs as they are)
        with torch.autocast(device.type, dtype=dtype):
            return run_backend(backend, q, k, v, parts, chunk_size)[0]

    def fwd_nograd():
        with torch.no_grad():
            fwd()

    def fwd_bwd():
        fwd().backward(g)

    for mode, fn in (("fwd", fwd_nograd), ("fwdbwd", fwd_bwd)):
        try:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            ms, reps, first, synced = median_ms(fn, warmup_ms, rep_ms, max_reps, leaves)
            row[f"{mode}_ms"] = ms
            row[f"{mode}_synced_ms"] = synced
            row[f"{mode}_reps"] = reps
            row[f"{mode}_first_ms"] = first
            row[f"{mode}_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
        except Exception as err:  # noqa: BLE001  (OOM is a result; anything else is re-raised)
            if not _is_oom(err):
                raise
            row[f"{mode}_status"] = "out of resources" if "resource" in str(err).lower() else "oom"
            row[f"{mode}_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        finally:
            for t in leaves:
                t.grad = None
            torch.cuda.empty_cache()
    row["status"] = "ok"
    return row


def run_bench(methods=METHODS, lengths=LENGTHS, batch: int = 1, heads: int = 12, head_dim: int = 64,
              dtype=torch.bfloat16, backends=BACKENDS, out_path=None, *, chunk_size: int = 256,
              dape_hidden: int = 32, dape_kernel: int = 3, max_call_s: float = 3.0, warmup_ms: float = 25,
              rep_ms: float = 200, max_reps: int = 50, only_at: dict | None = None, commit: str | None = None,
              command: str | None = None, log=print) -> dict:
    """Benchmark every (method, backend, length) on the current CUDA device -> result dict (see
    module docstring); written as JSON to out_path when given (after every length, so a run cut
    short keeps what it measured). only_at: {backend: lengths} runs that backend at those lengths
    only (e.g. FlexAttention recompiles for every length)."""
    only_at = only_at or {}
    if not torch.cuda.is_available():
        raise RuntimeError("lenx bench needs a CUDA device")
    device = torch.device("cuda")
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    result = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "git_commit": commit,
        "command": command if command is not None else " ".join(sys.argv),
        "args": dict(methods=list(methods), lengths=list(lengths), batch=batch, heads=heads, head_dim=head_dim,
                     dtype=str(dtype).replace("torch.", ""), backends=list(backends), chunk_size=chunk_size,
                     dape_hidden=dape_hidden, dape_kernel=dape_kernel, max_call_s=max_call_s,
                     warmup_ms=warmup_ms, rep_ms=rep_ms, max_reps=max_reps,
                     only_at={b: list(v) for b, v in only_at.items()}),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rows": [],
    }
    too_slow = set()  # (method, backend, mode) whose last call exceeded max_call_s
    for T in lengths:
        for method in methods:
            for backend in backends:
                key = (method, backend)
                if backend in only_at and T not in only_at[backend]:
                    continue
                if key in too_slow:
                    row = {"method": method, "backend": backend, "T": T,
                           "status": f"skipped: a shorter length ran out of memory or took over {max_call_s} s"}
                else:
                    t0 = time.time()
                    row = _measure(method, backend, T, batch=batch, heads=heads, head_dim=head_dim, dtype=dtype,
                                   device=device, chunk_size=chunk_size, dape_hidden=dape_hidden,
                                   dape_kernel=dape_kernel, warmup_ms=warmup_ms, rep_ms=rep_ms, max_reps=max_reps)
                    row["wall_s"] = round(time.time() - t0, 2)
                    # the median, not the first call: that one carries one-time costs (CUDA and
                    # cuBLAS start-up, compilation) and once skipped SDPA's chunked rows too early
                    slow = [row.get(f"{m}_ms", 0) for m in ("fwd", "fwdbwd")]
                    failed = {row.get("fwd_status"), row.get("fwdbwd_status")} & {"oom", "out of resources"}
                    if max(slow) > 1000 * max_call_s or failed:
                        too_slow.add(key)
                result["rows"].append(row)
                if log and not row["status"].startswith("unsupported"):
                    log(_row_line(row))
        _add_ratios(result)
        if out_path:
            with open(out_path, "w") as f:
                json.dump(result, f, indent=1)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if out_path:
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _add_ratios(result):
    """x SDPA: each row's time and peak memory over fused causal SDPA's at the same length."""
    base = {r["T"]: r for r in result["rows"] if r["method"] == "sdpa" and r["backend"] == "sdpa"}
    for r in result["rows"]:
        b = base.get(r["T"])
        if not b:
            continue
        for key in ("fwd_ms", "fwdbwd_ms", "fwd_peak_mib", "fwdbwd_peak_mib"):
            if key in r and key in b and b[key]:
                r[key.replace("_ms", "_x_sdpa").replace("_peak_mib", "_mem_x_sdpa")] = r[key] / b[key]


def _row_line(r):
    def cell(mode):
        if f"{mode}_ms" in r:
            return f"{mode} {r[f'{mode}_ms']:9.3f} ms {r[f'{mode}_peak_mib']:9.0f} MiB"
        return f"{mode} {r.get(f'{mode}_status', r['status'])}"
    if r["status"] != "ok":
        return f"{r['method']:>15} {r['backend']:>8} T={r['T']:>6}  {r['status']}"
    return f"{r['method']:>15} {r['backend']:>8} T={r['T']:>6}  {cell('fwd')} | {cell('fwdbwd')}"


# --- whole training steps (the DAPE V2 paper's table 7) ------------------------------------------

TRAIN_STEP_METHODS = ("sdpa", "rope", "alibi", "kerple", "fire", "dape-kerple", "dapev2-kerple")
KERPLE = "kerple"  # the method that step_gpu_x_kerple and wall_x_kerple divide by
SDPA_REFERENCES = ("sdpa", "rope")  # attn_x_sdpa divides by the first of these that ran on SDPA alone
PROFILE_KEYS = ("step_gpu_ms", "attn_fwd_gpu_ms", "attn_bwd_gpu_ms", "attn_gpu_ms", "unlinked_gpu_ms",
                "attn_ranges_per_step", "attn_kernels")
TOP_KERNELS = 12


def _train_step_row(method, model_cfg, cfg, batch_size, seq_len, vocab_size, steps, warmup, device,
                    profile_steps: int = 0) -> dict:
    """Build one model and time `steps` full optimizer steps after `warmup` untimed ones, then
    profile `profile_steps` more (see _profile_steps)."""
    from ..model import LM
    from ..model.precision import autocast_for
    from ..training.optim import adamw
    from ..training.step import train_step

    torch.manual_seed(0)
    model = LM(model_cfg).to(device)
    row = {"method": method, "backends": model.backends(device), "params": model.num_params()}
    optimizer = adamw(model, cfg.train, device)
    # one fixed batch: the step's cost does not depend on the token values, and no data loading is timed
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), device=device)
    batch = tokens[:, :-1], tokens[:, 1:]
    cuda = device.type == "cuda"

    def step():
        # bf16 autocast on CUDA, fp32 on CPU, as in training; the loss stays on the device (no sync)
        loss, _ = train_step(model, optimizer, [batch], lambda x, y: model(x, y)[1], clip=1.0,
                             autocast=lambda: autocast_for(device, "auto"))
        return loss

    model.train()
    for _ in range(warmup):  # compilation, autotuning, allocator growth, optimizer state creation
        step()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(steps):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        loss = step()
        if cuda:
            torch.cuda.synchronize(device)
        times.append(1000 * (time.perf_counter() - t0))
    row["times_ms"] = times
    row["median_ms"] = statistics.median(times)
    row["mean_ms"] = statistics.fmean(times)
    row["tokens_per_s"] = batch_size * seq_len / (row["median_ms"] / 1000)
    row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    row["final_loss"] = float(loss.detach())  # a sanity check that the steps computed something finite
    row.update(_profile_steps(step, profile_steps, device) if profile_steps else dict.fromkeys(PROFILE_KEYS))
    return row


def _profile_steps(step, n: int, device) -> dict:
    """Run one step and then `n` profiled ones under torch.profiler, with the attention's ranges on
    (lenx.attention.profiling) -> the row's profiler figures, per step:

    step_gpu_ms: every kernel (and memcpy/memset) of the step; attn_fwd_gpu_ms / attn_bwd_gpu_ms:
    the kernels launched inside the attention's forward / backward ranges, all layers;
    attn_gpu_ms: their sum; unlinked_gpu_ms: kernels the profiler linked to no CPU event (in
    step_gpu_ms, in no attention figure); attn_ranges_per_step: ranges seen per step (n_layer each
    when the attribution worked); attn_kernels: the TOP_KERNELS attention kernels by time, with
    their pass, ms and calls per step. Each kernel is counted once, at its own duration.
    On a CPU there are no kernels: the same figures are the CPU ops' self time."""
    from torch.profiler import ProfilerActivity, profile

    from ..attention.profiling import BACKWARD, FORWARD, attention_profile, attention_ranges

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with attention_ranges(), warnings.catch_warnings():
        # torch 2.11 warns, for one profile, that a profile's events end with its cycle
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
        step()  # the markers' first call, unprofiled
        if cuda:
            torch.cuda.synchronize(device)
        with profile(activities=activities, record_shapes=False) as prof:
            for _ in range(n):
                step()
            if cuda:
                torch.cuda.synchronize(device)  # every kernel finished before the trace is collected
    p = attention_profile(prof.events(), kernels=cuda)
    ms = lambda us: us / n / 1000  # noqa: E731  (microseconds over the profile -> ms per step)
    kernels = sorted(((us, kind, name, count) for kind in (FORWARD, BACKWARD)
                      for name, (us, count) in p.by_name[kind].items()), reverse=True)
    return {
        "step_gpu_ms": ms(p.total_us),
        "attn_fwd_gpu_ms": ms(p.forward_us),
        "attn_bwd_gpu_ms": ms(p.backward_us),
        "attn_gpu_ms": ms(p.forward_us + p.backward_us),
        "unlinked_gpu_ms": ms(p.unlinked_us),
        "attn_ranges_per_step": {"fwd": p.ranges[FORWARD] / n, "bwd": p.ranges[BACKWARD] / n},
        "attn_kernels": [{"name": name, "pass": "fwd" if kind == FORWARD else "bwd", "ms_per_step": ms(us),
                          "calls_per_step": count / n} for us, kind, name, count in kernels[:TOP_KERNELS]],
    }


def _check_backend_overrides(backend_overrides: dict, methods, model_cfg, device) -> None:
    """A forced backend must name a benchmarked method and a backend that runs it here: checked on one
    attention layer before any model is timed (ConfigError with the planner's reason)."""
    from ..attention import Attention
    from ..config import ConfigError

    for method, backend in backend_overrides.items():
        if method not in methods:
            raise ConfigError(f"backend override for {method!r}, which is not among the methods ({', '.join(methods)})")
        layer_cfg = replace(model_cfg, method="nope" if method == "sdpa" else method, backend=backend)
        try:
            Attention(layer_cfg, model_cfg.n_head, model_cfg.d_model).backend_for(device)
        except ValueError as e:
            raise ConfigError(f"{method}={backend}: {e}") from None


def train_step_bench(methods: list[str], preset: str = "125m", seq_len: int = 512, batch_size: int = 32,
                     vocab_size: int = 16384, steps: int = 20, warmup: int = 5, device: str = "cuda",
                     reference: str = "dapev2-kerple", backend_overrides: dict[str, str] | None = None,
                     overrides: list[str] | None = None, *, profile_steps: int = 4, commit: str | None = None,
                     command: str | None = None, out_path=None, log=print) -> dict:
    """Time per training step and peak memory of the whole model, per method (the DAPE V2 paper's
    table 7): the `preset` model with each method, random tokens, AdamW, bf16 autocast on CUDA.
    Each row has the median and mean wall ms/step (each step synchronized), tokens/s, peak GiB (None
    on CPU), the backend of each layer, and `ratio`: its median over the `reference` method's (None
    without a reference row). Then `profile_steps` more steps run under torch.profiler (0: none):
    the GPU kernel time of a step and of its attention (_profile_steps; CPU op time on a CPU), and
    the ratios of _add_train_step_ratios (attn_x_sdpa, step_gpu_x_kerple, wall_x_kerple).
    A method that fails (out of memory included) gets a row with "error" and the others still run.
    backend_overrides: {method: backend} forces an attention backend for that method."""
    from ..attention.methods import parse_method
    from ..config import ConfigError, load_config
    from ..model import check_config
    from ..runinfo import environment

    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train_step_bench: device cuda but no CUDA device is visible (use device='cpu')")
    if profile_steps < 0:
        raise ConfigError(f"profile_steps must be 0 (no profile) or more, not {profile_steps}")
    cfg = load_config(preset, overrides or [])
    check_config(cfg)
    backend_overrides = backend_overrides or {}
    for method in methods:  # a typo is an error now, not a row after minutes of benchmarking
        parse_method("nope" if method == "sdpa" else method)
    _check_backend_overrides(backend_overrides, methods, cfg.model, dev)
    env = environment(dev)
    result = {
        "benchmark": "train_step",
        "device": env.get("gpu") or f"cpu ({env.get('cpu')})",
        "torch": env["torch"],
        "triton": env["triton"],
        "cuda": torch.version.cuda,
        "python": env["python"],
        "git_commit": commit or env["git_commit"],
        "command": command if command is not None else env["command"],
        "settings": dict(methods=list(methods), preset=preset, seq_len=seq_len, batch_size=batch_size,
                         vocab_size=vocab_size, steps=steps, warmup=warmup, profile_steps=profile_steps,
                         device=device, reference=reference,
                         backend_overrides=dict(backend_overrides), overrides=list(overrides or []),
                         model={k: v for k, v in vars(cfg.model).items() if k != "method"}),
        "profiled_time": None if not profile_steps else (
            "GPU kernel time (torch.profiler, CUDA activity)" if dev.type == "cuda" else
            "CPU op self time (torch.profiler, CPU activity; no GPU: the *_gpu_ms keys hold CPU time)"),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rows": [],
    }
    for method in methods:
        model_cfg = replace(cfg.model, method="nope" if method == "sdpa" else method, vocab_size=vocab_size,
                            backend=backend_overrides.get(method, cfg.model.backend))
        try:
            row = _train_step_row(method, model_cfg, cfg, batch_size, seq_len, vocab_size, steps, warmup, dev,
                                  profile_steps)
        except Exception as err:  # noqa: BLE001  (a method that fails is a result; the others still run)
            kind = "oom" if _is_oom(err) else "error"
            row = {"method": method, "status": kind, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
        # the failed step's tensors are referenced by the traceback until here; free them before the next method
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        result["rows"].append(row)
        if log:
            log(_train_step_line(row))
    _add_train_step_ratios(result, reference)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if out_path:
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _ratio(a, b):
    return a / b if a is not None and b else None


def _add_train_step_ratios(result, reference: str) -> None:
    """Each measured row's ratios, in place: `ratio` (wall median over the `reference` method's),
    `wall_x_kerple` and `step_gpu_x_kerple` (wall median and step GPU time over Kerple's), and
    `attn_x_sdpa` (attention GPU time over SDPA's: the row of result["sdpa_reference"], the first
    method of SDPA_REFERENCES that was profiled with every layer on the sdpa backend; "rope" rotates
    q and k before its attention, outside the attention's ranges). None where a figure is missing."""
    rows = [r for r in result["rows"] if "median_ms" in r]
    by_method = {r["method"]: r for r in rows}
    ref, kerple = by_method.get(reference, {}), by_method.get(KERPLE, {})
    sdpa_ref = next((m for m in SDPA_REFERENCES if m in by_method and by_method[m].get("attn_gpu_ms")
                     and set(by_method[m]["backends"]) == {"sdpa"}), None)
    result["sdpa_reference"] = sdpa_ref
    sdpa = by_method.get(sdpa_ref, {})
    for r in result["rows"]:
        r["ratio"] = _ratio(r.get("median_ms"), ref.get("median_ms"))
        r["wall_x_kerple"] = _ratio(r.get("median_ms"), kerple.get("median_ms"))
        r["step_gpu_x_kerple"] = _ratio(r.get("step_gpu_ms"), kerple.get("step_gpu_ms"))
        r["attn_x_sdpa"] = _ratio(r.get("attn_gpu_ms"), sdpa.get("attn_gpu_ms"))


def _train_step_line(r) -> str:
    if "error" in r:
        return f"{r['method']:>15}  {r['error']}"
    peak = f"{r['peak_gib']:.2f} GiB" if r["peak_gib"] is not None else "peak n/a"
    line = f"{r['method']:>15}  {r['median_ms']:9.2f} ms/step  {r['tokens_per_s']:10.0f} tok/s  {peak}"
    if r.get("step_gpu_ms") is not None:
        line += (f"  profiled: step {r['step_gpu_ms']:.3f} ms, attention {r['attn_gpu_ms']:.3f} ms "
                 f"({r['attn_fwd_gpu_ms']:.3f} fwd + {r['attn_bwd_gpu_ms']:.3f} bwd)")
    return line
