"""Whole training steps per method (`lenx bench --train-step`; the DAPE V2 paper's table 7): the wall
time of a synchronized step, tokens/s and peak memory of the --preset model, each step the one
training step of lenx.training.step. Besides the wall time it profiles a few more steps with
torch.profiler and reports GPU kernel time: of the whole step, and of the attention's kernels
(forward and backward, marked by lenx.attention.profiling), with ratios against Kerple and SDPA.
Wall times also count the host launching the kernels (host-bound where kernels are short, as the
attention's are at training shapes), so the kernel times are the figures that compare the attention
methods' GPU cost. With documents = N each method also runs packed: every window cut into N
documents (document ids, positions restarting per document, as train.documents=masked), its row
beside the unmasked one with the ratios over it (*_x_unmasked). Library use:
train_step_bench(...) -> dict (also written as JSON); its table: lenx.report.bench_tables.
"""

from dataclasses import replace
import gc
import os
import statistics
import time
import warnings

import torch

from .common import check_documents, is_oom, packed_document_ids, write_result

TRAIN_STEP_METHODS = ("sdpa", "rope", "alibi", "kerple", "fire", "dape-kerple", "dapev2-kerple")
KERPLE = "kerple"  # the method that step_gpu_x_kerple and wall_x_kerple divide by
SDPA_REFERENCES = ("sdpa", "rope")  # attn_x_sdpa divides by the first of these that ran on SDPA alone
PROFILE_KEYS = ("step_gpu_ms", "attn_fwd_gpu_ms", "attn_bwd_gpu_ms", "attn_gpu_ms", "other_gpu_ms",
                "unlinked_gpu_ms", "attn_ranges_per_step", "attn_kernels")
TOP_KERNELS = 12
ID_DRAWS = 4  # distinct document-id batches a packed row cycles through: each step gets new ids, as in training


def _train_step_row(method, model_cfg, cfg, batch_size, seq_len, vocab_size, steps, warmup, device,
                    profile_steps: int = 0, documents: int = 0, top_kernels: int = 0) -> dict:
    """Build one model and time `steps` full optimizer steps after `warmup` untimed ones, then
    profile `profile_steps` more (see _profile_steps). documents: each window packed from that many
    documents (0: unmasked); the ids, drawn on the host, go to the device every step as training's do."""
    from ..model import LM
    from ..model.precision import autocast_for
    from ..training.optim import adamw
    from ..training.step import train_step

    torch.manual_seed(0)
    model = LM(model_cfg).to(device)
    masked = documents > 0
    row = {"method": method, "documents": documents, "backends": model.backends(device, masked),
           "params": model.num_params()}
    if model.backend_notes(device, masked):
        row["backend_notes"] = model.backend_notes(device, masked)
    optimizer = adamw(model, cfg.train, device)
    # one fixed batch: the step's cost does not depend on the token values, and no data loading is timed
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), device=device)
    batch = tokens[:, :-1], tokens[:, 1:]
    cuda = device.type == "cuda"
    draws = [packed_document_ids(batch_size, seq_len, documents, draw) for draw in range(ID_DRAWS)] if masked else []
    steps_run = 0

    def step():
        nonlocal steps_run
        ids = (draws[steps_run % ID_DRAWS].to(device, non_blocking=True),) if masked else ()
        steps_run += 1
        # bf16 autocast on CUDA, fp32 on CPU, as in training; the loss stays on the device (no sync)
        loss, _ = train_step(model, optimizer, [batch + ids], lambda x, y, ids=None: model(x, y, ids)[1], clip=1.0,
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
    if any(model.kernels()):  # the fused kernel each layer ran in the last step (DAPE V2's skewed mode)
        row["kernels"] = model.kernels()
    row["final_loss"] = float(loss.detach())  # a sanity check that the steps computed something finite
    row.update(_profile_steps(step, profile_steps, device, top_kernels) if profile_steps
               else dict.fromkeys(PROFILE_KEYS))
    return row


def _profile_steps(step, n: int, device, top_kernels: int = 0) -> dict:
    """Run one step and then `n` profiled ones under torch.profiler, with the attention's ranges on
    (lenx.attention.profiling) -> the row's profiler figures, per step:

    step_gpu_ms: every kernel (and memcpy/memset) of the step; attn_fwd_gpu_ms / attn_bwd_gpu_ms:
    the kernels launched inside the attention's forward / backward ranges, all layers;
    attn_gpu_ms: their sum; other_gpu_ms: step_gpu_ms less attn_gpu_ms (the projections, MLPs,
    loss, optimizer, and a q/k transform such as RoPE's rotation); unlinked_gpu_ms: kernels the
    profiler linked to no CPU event (in step_gpu_ms, in no attention figure); attn_ranges_per_step:
    ranges seen per step (n_layer each when the attribution worked); attn_kernels: the TOP_KERNELS
    attention kernels by time, with their pass, ms and calls per step; with top_kernels = N > 0 also
    other_kernels: the N kernels outside the attention's ranges with the most time, each with its pass
    ("fwd": forward, loss or optimizer; "bwd": backward; see AttentionProfile.outside). Each kernel
    is counted once, at its own duration.
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
    others = sorted(((us, where, name, count) for (name, where), (us, count) in p.outside.items()), reverse=True)
    top = {"other_kernels": [{"name": name, "pass": where, "ms_per_step": ms(us), "calls_per_step": count / n}
                             for us, where, name, count in others[:top_kernels]]} if top_kernels else {}
    return {
        "step_gpu_ms": ms(p.total_us),
        "attn_fwd_gpu_ms": ms(p.forward_us),
        "attn_bwd_gpu_ms": ms(p.backward_us),
        "attn_gpu_ms": ms(p.forward_us + p.backward_us),
        "other_gpu_ms": ms(p.total_us - p.forward_us - p.backward_us),
        "unlinked_gpu_ms": ms(p.unlinked_us),
        "attn_ranges_per_step": {"fwd": p.ranges[FORWARD] / n, "bwd": p.ranges[BACKWARD] / n},
        "attn_kernels": [{"name": name, "pass": "fwd" if kind == FORWARD else "bwd", "ms_per_step": ms(us),
                          "calls_per_step": count / n} for us, kind, name, count in kernels[:TOP_KERNELS]],
        **top,
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


def _check_memory(model_cfgs: dict, batch_size: int, seq_len: int, device, segments: bool = False) -> None:
    """The guard `lenx train` has (lenx.model.memory), per method, before any model is built: a step
    that would not fit is a one-line ConfigError, not minutes of swapping or an allocator's traceback.
    segments: also the packed step (an SDPA layer's boolean mask per document batch)."""
    from ..model.memory import check_memory, estimate_memory

    for method, model_cfg in model_cfgs.items():
        estimate = estimate_memory(model_cfg, batch_size, seq_len, device, segments=segments)
        check_memory(estimate, device, f"{method}: a training step of {batch_size} sequences of {seq_len} tokens",
                     "lower --seq-len or --batch")


def train_step_bench(methods: list[str], preset: str = "125m", seq_len: int = 512, batch_size: int = 32,
                     vocab_size: int = 16384, steps: int = 20, warmup: int = 5, device: str = "cuda",
                     reference: str = "dapev2-kerple", backend_overrides: dict[str, str] | None = None,
                     overrides: list[str] | None = None, *, profile_steps: int = 4, commit: str | None = None,
                     command: str | None = None, out_path=None, log=print, memory_check: bool = True,
                     documents: int = 0, top_kernels: int = 0) -> dict:
    """Time per training step and peak memory of the whole model, per method (the DAPE V2 paper's
    table 7): the `preset` model with each method, random tokens, AdamW, bf16 autocast on CUDA.
    Each row has the median and mean wall ms/step (each step synchronized), tokens/s, peak GiB (None
    on CPU), the backend of each layer, and `ratio`: its median over the `reference` method's (None
    without a reference row). Then `profile_steps` more steps run under torch.profiler (0: none):
    the GPU kernel time of a step and of its attention (_profile_steps; CPU op time on a CPU), and
    the ratios of _add_train_step_ratios (attn_x_sdpa, step_gpu_x_kerple, wall_x_kerple).
    A method that fails (out of memory included) gets a row with "error" and the others still run.
    backend_overrides: {method: backend} forces an attention backend for that method. memory_check:
    first refuse (one line) a method whose step would not fit the device's memory, as training does.
    documents: N > 0 adds, after each method's row, its step with every window packed from N
    documents (common.packed_document_ids), and the ratios of _add_train_step_ratios over the unmasked.
    top_kernels: N > 0 lists each row's N costliest kernels outside the attention (other_kernels)."""
    from ..attention.methods import parse_method
    from ..config import ConfigError, load_config
    from ..model import check_config
    from ..runinfo import environment

    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train_step_bench: device cuda but no CUDA device is visible (use device='cpu')")
    if profile_steps < 0:
        raise ConfigError(f"profile_steps must be 0 (no profile) or more, not {profile_steps}")
    if top_kernels < 0 or (top_kernels and not profile_steps):
        raise ConfigError(f"top_kernels must be 0 (none) or more, with profiled steps (profile_steps > 0); got "
                          f"top_kernels={top_kernels}, profile_steps={profile_steps}")
    if documents:
        check_documents(documents, seq_len, "documents")
    cfg = load_config(preset, overrides or [])
    check_config(cfg)
    backend_overrides = backend_overrides or {}
    for method in methods:  # a typo is an error now, not a row after minutes of benchmarking
        parse_method("nope" if method == "sdpa" else method)
    _check_backend_overrides(backend_overrides, methods, cfg.model, dev)
    model_cfgs = {method: replace(cfg.model, method="nope" if method == "sdpa" else method, vocab_size=vocab_size,
                                  backend=backend_overrides.get(method, cfg.model.backend)) for method in methods}
    if memory_check:
        _check_memory(model_cfgs, batch_size, seq_len, dev, segments=documents > 0)
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
                         top_kernels=top_kernels,
                         device=device, reference=reference, documents=documents,
                         backend_overrides=dict(backend_overrides), overrides=list(overrides or []),
                         environment={k: v for k, v in sorted(os.environ.items()) if k.startswith("LENX_")},
                         model={k: v for k, v in vars(cfg.model).items() if k != "method"}),
        "profiled_time": None if not profile_steps else (
            "GPU kernel time (torch.profiler, CUDA activity)" if dev.type == "cuda" else
            "CPU op self time (torch.profiler, CPU activity; no GPU: the *_gpu_ms keys hold CPU time)"),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rows": [],
    }
    for method, docs in [(m, d) for m in methods for d in ((0, documents) if documents else (0,))]:
        try:
            row = _train_step_row(method, model_cfgs[method], cfg, batch_size, seq_len, vocab_size, steps, warmup, dev,
                                  profile_steps, docs, top_kernels)
        except Exception as err:  # noqa: BLE001  (a method that fails is a result; the others still run)
            kind = "oom" if is_oom(err) else "error"
            row = {"method": method, "documents": docs, "status": kind,
                   "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
        # the failed step's tensors are referenced by the traceback until here; free them before the next method
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        result["rows"].append(row)
        if out_path:  # after every row: a run cut short (a device call's time limit) keeps what it measured
            _add_train_step_ratios(result, reference)
            write_result(out_path, result)
        if log:
            log(_train_step_line(row))
    _add_train_step_ratios(result, reference)
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if out_path:
        write_result(out_path, result)
    return result


def _ratio(a, b):
    return a / b if a is not None and b else None


def _add_train_step_ratios(result, reference: str) -> None:
    """Each measured row's ratios, in place: `ratio` (wall median over the `reference` method's),
    `wall_x_kerple` and `step_gpu_x_kerple` (wall median and step GPU time over Kerple's), and
    `attn_x_sdpa` (attention GPU time over SDPA's: the row of result["sdpa_reference"], the first
    method of SDPA_REFERENCES that was profiled with every layer on the sdpa backend; "rope" rotates
    q and k before its attention, outside the attention's ranges), each among rows of the same
    packing. A packed row also gets wall_x_unmasked, step_gpu_x_unmasked, attn_x_unmasked and
    peak_x_unmasked: over its method's unmasked row. None where a figure is missing."""
    packings = sorted({r.get("documents", 0) for r in result["rows"]})
    result["sdpa_reference"] = None
    for docs in packings:
        sdpa_ref = _add_ratios_among([r for r in result["rows"] if r.get("documents", 0) == docs], reference)
        if docs == 0:
            result["sdpa_reference"] = sdpa_ref
    unmasked = {r["method"]: r for r in result["rows"] if not r.get("documents") and "median_ms" in r}
    for r in result["rows"]:
        if r.get("documents"):
            base = unmasked.get(r["method"], {})
            for key, name in (("median_ms", "wall"), ("step_gpu_ms", "step_gpu"), ("attn_gpu_ms", "attn"),
                              ("peak_gib", "peak")):
                r[f"{name}_x_unmasked"] = _ratio(r.get(key), base.get(key))


def _add_ratios_among(group: list, reference: str) -> str | None:
    """_add_train_step_ratios' ratios among one packing's rows -> the method whose row is the SDPA reference."""
    rows = [r for r in group if "median_ms" in r]
    by_method = {r["method"]: r for r in rows}
    ref, kerple = by_method.get(reference, {}), by_method.get(KERPLE, {})
    sdpa_ref = next((m for m in SDPA_REFERENCES if m in by_method and by_method[m].get("attn_gpu_ms")
                     and set(by_method[m]["backends"]) == {"sdpa"}), None)
    sdpa = by_method.get(sdpa_ref, {})
    for r in group:
        r["ratio"] = _ratio(r.get("median_ms"), ref.get("median_ms"))
        r["wall_x_kerple"] = _ratio(r.get("median_ms"), kerple.get("median_ms"))
        r["step_gpu_x_kerple"] = _ratio(r.get("step_gpu_ms"), kerple.get("step_gpu_ms"))
        r["attn_x_sdpa"] = _ratio(r.get("attn_gpu_ms"), sdpa.get("attn_gpu_ms"))
    return sdpa_ref


def row_label(r) -> str:
    """The method, and the packing of a packed row."""
    return f"{r['method']} ({r['documents']} docs)" if r.get("documents") else r["method"]


def _train_step_line(r) -> str:
    if "error" in r:
        return f"{row_label(r):>15}  {r['error']}"
    peak = f"{r['peak_gib']:.2f} GiB" if r["peak_gib"] is not None else "peak n/a"
    line = f"{row_label(r):>15}  {r['median_ms']:9.2f} ms/step  {r['tokens_per_s']:10.0f} tok/s  {peak}"
    if r.get("step_gpu_ms") is not None:
        line += (f"  profiled: step {r['step_gpu_ms']:.3f} ms, attention {r['attn_gpu_ms']:.3f} ms "
                 f"({r['attn_fwd_gpu_ms']:.3f} fwd + {r['attn_bwd_gpu_ms']:.3f} bwd)")
    return line
