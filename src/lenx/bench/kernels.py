"""Time and peak memory of the attention backends, per method and length (`lenx bench`).

For every method, backend and length: forward time (no autograd graph), forward+backward time, and
the peak memory of each (torch.cuda.max_memory_allocated after a reset, inputs included). Times
are per call, calls run back to back between two CUDA events after a warm-up (median of 5
batches); each row also records the median of calls timed one at a time (`*_synced_ms`). Ratios
are taken against fused causal SDPA measured in the same run. Out-of-memory is caught and recorded as such; a call slower
than `max_call_s` (median) skips the longer lengths of that (method, backend).

FoX (a per-token bias: forget gates of the layer's input) is timed from a leaf of gate logits
[B, H, T]: each call takes their log-sigmoid prefix sums and binds the bias to them (_bound).

The triton backend's rows record `fwd_kernel`: its forward-only calls of DAPE V2 run the Gluon kernel
on sm_90 (attention/backends/fused.py), and the table then names it ("triton (gluon fwd)").

With gpu_time = N each mode is also profiled for N more calls (torch.profiler, CUDA activity):
`fwd_gpu_ms` / `fwdbwd_gpu_ms`, the device work (kernels, memcpy, memset) of one call, summed and
averaged over the N. Where the host launches a call's kernels more slowly than the GPU runs them
(many small ops, a short sequence) `*_ms` is the host's time and the GPU time says what the kernels
cost (the training-step bench reports the same kind of figure, lenx.bench.train_step).

With documents = N every row runs with document ids: each row of the batch packed from N documents
(common.packed_document_ids). One ids tensor serves all of a row's calls, as the layers of one step
share theirs: a backend that builds its mask from the ids (FlexAttention's block mask, cached while
the ids stay the same) pays that once here; SDPA builds its boolean [B, T, T] mask in every call.

Library use: run_bench(...) -> dict (also written as JSON); its table: lenx.report.bench_tables.
Whole training steps: lenx.bench.train_step. Tile sweeps and kernel probes are lab-bench scripts
(scripts/tune/), which time with median_ms.
"""

from dataclasses import replace
import platform
import statistics
import sys
import time
import warnings

import torch
from torch.nn import functional as F

from ..attention import Attention, AttentionConfig
from ..attention.backends import run_backend, unsupported_reason
from ..config import ConfigError
from .common import check_documents, is_oom, packed_document_ids, write_result

METHODS = ("sdpa", "kerple", "dapev2-kerple", "stickbreaking")
BACKENDS = ("sdpa", "flex", "triton", "chunked", "dense")
LENGTHS = (512, 2048, 8192, 16384, 32768)


def _parts(method: str, heads: int, head_dim: int, device, dape_hidden: int, dape_kernel: int, window: int = 0):
    """The attention parts of a lenx method ("sdpa" = plain causal softmax, lenx's "nope"), with a
    sliding window of `window` keys (0: none)."""
    name = "nope" if method == "sdpa" else method
    cfg = AttentionConfig(method=name, backend="dense", dape_hidden=dape_hidden, dape_kernel=dape_kernel,
                          sb_remainder="drop", window=window)
    module = Attention(cfg, heads, heads * head_dim).to(device)
    return module.parts, [p for n, p in module.named_parameters() if not n.startswith(("qkv", "proj"))]


def _gate_logits(parts, batch: int, heads: int, T: int, device):
    """A leaf of forget-gate logits [B, H, T] for a per-token bias (FoX's, which reads the layer's
    input: the kernels time it from logits instead), else None."""
    if parts.bias is None or not parts.bias.per_token:
        return None
    return torch.randn(batch, heads, T, device=device, requires_grad=True)


def _bound(parts, gate):
    """The parts a call runs: FoX's bias bound to the prefix sums of log sigmoid(gate), taken in every
    call as the attention module does (their cumsum and its backward are FoX's work too)."""
    return parts if gate is None else replace(parts, bias=parts.bias.bind(F.logsigmoid(gate).cumsum(-1)))


def median_ms(fn, warmup_ms: float, rep_ms: float, max_reps: int, grads_to_none=()):
    """Time of one fn() in ms -> (back-to-back ms, reps, first-call ms, synchronized-call ms).

    Back to back (the figure the ratios use, as triton.testing.do_bench and the flash-attention
    benchmarks time): n calls between two CUDA events, no synchronisation in between, so the CPU
    queues the next call while the GPU runs this one, as in training or evaluation; the median of
    5 such batches, over n. Synchronized: the median of calls each timed alone and waited for,
    which also counts the launch latency of every small op (a bias table built per call, say).
    grads_to_none: tensors whose .grad is reset before every call, for an fn that calls .backward()
    (scripts/tune's probes), so that no call accumulates into the previous one's gradients."""
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


def profiled_gpu_ms(fn, calls: int, device) -> float:
    """Device time of one fn() in ms: torch.profiler's device work (kernels, memcpy, memset) over
    `calls` calls after one unprofiled call, each event once (lenx.attention.profiling's reading of a
    profile), over calls. On a CPU (no kernels) the CPU ops' self time instead, as there."""
    from torch.profiler import ProfilerActivity, profile

    from ..attention.profiling import attention_profile

    cuda = device.type == "cuda"
    fn()
    if cuda:
        torch.cuda.synchronize(device)
    with warnings.catch_warnings():
        # torch 2.11 warns, for one profile, that a profile's events end with its cycle
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            for _ in range(calls):
                fn()
            if cuda:
                torch.cuda.synchronize(device)  # every kernel finished before the trace is collected
    return attention_profile(prof.events(), kernels=cuda).total_us / calls / 1000


def _measure(method, backend, T, *, batch, heads, head_dim, dtype, device, chunk_size, dape_hidden, dape_kernel,
             warmup_ms, rep_ms, max_reps, window=0, documents=0, gpu_time=0):
    """One row: fwd / fwd+bwd time and peak memory. Raises on anything but OOM."""
    torch.manual_seed(0)
    parts, params = _parts(method, heads, head_dim, device, dape_hidden, dape_kernel, window)
    segments = packed_document_ids(batch, T, documents).to(device) if documents else None
    if documents:
        parts = replace(parts, segments=True)
    row = {"method": method, "backend": backend, "T": T}
    reason = unsupported_reason(backend, parts, device)
    if reason:
        row["status"] = f"unsupported: {reason}"
        return row
    shape = (batch, heads, T, head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    g = torch.randn(shape, device=device, dtype=dtype)
    gate = _gate_logits(parts, batch, heads, T, device)
    leaves = [q, k, v] + params + ([gate] if gate is not None else [])
    if backend == "triton":  # forward-only DAPE V2 work may run the Gluon kernel (fused._use_gluon)
        from ..attention.backends.fused import forward_kernel

        with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
            row["fwd_kernel"] = forward_kernel(q, k, v, _bound(parts, gate))
        if getattr(parts.processor, "kernel_note", None):  # e.g. tables out of the Gluon forward's range
            row["fwd_kernel_note"] = parts.processor.kernel_note

    def fwd():
        # autocast as in mixed-precision training: the dense/chunked paths' convs and matmuls run
        # in bf16 with fp32 parameters (the fused paths take the bf16 inputs as they are)
        with torch.autocast(device.type, dtype=dtype):
            return run_backend(backend, q, k, v, _bound(parts, gate), chunk_size, segments)[0]

    def fwd_nograd():
        with torch.no_grad():
            fwd()

    def fwd_bwd():
        # the gradients of q, k, v and the parts' parameters, returned rather than accumulated
        # into .grad: the same backward work, and no gradient outlives its call
        torch.autograd.grad(fwd(), leaves, g, allow_unused=True)

    for mode, fn in (("fwd", fwd_nograd), ("fwdbwd", fwd_bwd)):
        try:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            ms, reps, first, synced = median_ms(fn, warmup_ms, rep_ms, max_reps)
            row[f"{mode}_ms"] = ms
            row[f"{mode}_synced_ms"] = synced
            row[f"{mode}_reps"] = reps
            row[f"{mode}_first_ms"] = first
            row[f"{mode}_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
            if gpu_time:
                row[f"{mode}_gpu_ms"] = profiled_gpu_ms(fn, gpu_time, device)
        except Exception as err:  # noqa: BLE001  (OOM is a result; anything else is re-raised)
            if not is_oom(err):
                raise
            row[f"{mode}_status"] = "out of resources" if "resource" in str(err).lower() else "oom"
            row[f"{mode}_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        finally:
            torch.cuda.empty_cache()
    row["status"] = "ok"
    return row


def run_bench(methods=METHODS, lengths=LENGTHS, batch: int = 1, heads: int = 12, head_dim: int = 64,
              dtype=torch.bfloat16, backends=BACKENDS, out_path=None, *, chunk_size: int = 256,
              dape_hidden: int = 32, dape_kernel: int = 3, max_call_s: float = 3.0, warmup_ms: float = 25,
              rep_ms: float = 200, max_reps: int = 50, only_at: dict | None = None, commit: str | None = None,
              command: str | None = None, window: int = 0, documents: int = 0, gpu_time: int = 0,
              log=print) -> dict:
    """Benchmark every (method, backend, length) on the current CUDA device -> result dict (see
    module docstring); written as JSON to out_path when given (after every length, so a run cut
    short keeps what it measured). only_at: {backend: lengths} runs that backend at those lengths
    only (e.g. FlexAttention recompiles for every length). window: every row with a sliding window
    of that many keys (the fused DAPE V2 rows then run its O(T) kernel: fwd_kernel_note). documents: every row
    with each sequence packed from that many documents (0: one; see the module docstring). gpu_time:
    profiled calls per mode for fwd_gpu_ms / fwdbwd_gpu_ms (0: none; see the module docstring)."""
    only_at = only_at or {}
    if isinstance(gpu_time, bool) or not isinstance(gpu_time, int) or gpu_time < 0:
        raise ConfigError(f"gpu_time takes a number of profiled calls >= 0 (0: none), not {gpu_time!r}")
    for T in lengths if documents else ():
        check_documents(documents, T, "documents")
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
                     only_at={b: list(v) for b, v in only_at.items()}, window=window, documents=documents,
                     gpu_time=gpu_time),
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
                                   dape_kernel=dape_kernel, warmup_ms=warmup_ms, rep_ms=rep_ms, max_reps=max_reps,
                                   window=window, documents=documents, gpu_time=gpu_time)
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
            write_result(out_path, result)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if out_path:
        write_result(out_path, result)
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
