"""Tables of `lenx bench`: attention kernels against fused SDPA, whole training steps, decoding."""

from .tables import Table, columns

BENCH_COLUMNS = ("method", "backend", "T", "fwd ms", "x SDPA", "fwd+bwd ms", "x SDPA", "peak MiB (f+b)", "x SDPA")
GPU_COLUMNS = ("fwd GPU ms", "fwd+bwd GPU ms")  # with --gpu-time
DECODE_COLUMNS = ("method", "mode", "context", "batch", "ms/token", "tokens/s", "x GPT-2", "peak GiB")
TRAIN_STEP_COLUMNS = ("method", "backend(s)", "wall ms/step", "step GPU ms", "x Kerple (GPU)",
                      "attn GPU ms (fwd+bwd)", "X vs SDPA", "tokens/s", "peak GiB")


def _versions(result: dict) -> str:
    return f"{result['device']} | torch {result['torch']} | triton {result['triton']} | CUDA {result['cuda']}"


def _num(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def bench_table(result: dict) -> Table:
    """A run_bench result: time and peak memory, and their ratios to SDPA, per method, backend and
    length (unsupported combinations left out)."""
    a = result["args"]
    masks = "".join(f" {name}={a[key]}" for key, name in (("window", "W"), ("documents", "documents")) if a.get(key))
    gpu = bool(a.get("gpu_time"))
    table = Table(f"{_versions(result)} | B={a['batch']} H={a['heads']} d={a['head_dim']} {a['dtype']}{masks} | "
                  f"commit {result.get('git_commit')}", columns(*BENCH_COLUMNS, *(GPU_COLUMNS if gpu else ()),
                                                                right_from=2),
                  caption=(f"GPU ms: torch.profiler kernel time of one call (mean of {a['gpu_time']} profiled "
                           "calls); the other times are wall times of calls back to back") if gpu else None)
    for r in result["rows"]:
        if r["status"].startswith("unsupported"):
            continue
        backend = r["backend"] + (f" ({r['fwd_kernel']} fwd)" if r.get("fwd_kernel", r["backend"]) != r["backend"] else "")
        head = [r["method"], backend, str(r["T"])]
        if r["status"] != "ok":
            table.add_row(*head, r["status"].split(":")[0], *[""] * (7 if gpu else 5))
            continue
        fwd = _num(r.get("fwd_ms"), ".3f") or r.get("fwd_status", "")
        fb = _num(r.get("fwdbwd_ms"), ".3f") or r.get("fwdbwd_status", "")
        table.add_row(*head, fwd, _num(r.get("fwd_x_sdpa"), ".2f"), fb, _num(r.get("fwdbwd_x_sdpa"), ".2f"),
                      _num(r.get("fwdbwd_peak_mib"), ".0f"), _num(r.get("fwdbwd_mem_x_sdpa"), ".2f"),
                      *([_num(r.get("fwd_gpu_ms"), ".3f"), _num(r.get("fwdbwd_gpu_ms"), ".3f")] if gpu else []))
    return table


def train_step_table(result: dict) -> Table:
    """A train_step_bench result, one row per method (and per packing: a packed row's step GPU time
    over its unmasked row's in the last column); its caption says which times are kernel times."""
    s = result["settings"]
    packed = bool(s.get("documents"))
    table = Table(f"{_versions(result)} | preset {s['preset']} B={s['batch_size']} T={s['seq_len']} "
                  f"V={s['vocab_size']} {s['steps']} steps | ref {s['reference']} | commit {result.get('git_commit')}",
                  columns(*TRAIN_STEP_COLUMNS, *(["x unmasked (GPU)"] if packed else []), right_from=2),
                  caption=_train_step_caption(result))
    for r in result["rows"]:
        label = f"{r['method']} ({r['documents']} docs)" if r.get("documents") else r["method"]
        if "error" in r:
            table.add_row(label, "", r.get("status", "error"), *[""] * (7 if packed else 6))
            continue
        backends = ",".join(dict.fromkeys(r["backends"]))  # one name when every layer uses the same backend
        attn = "" if r.get("attn_gpu_ms") is None else (
            f"{r['attn_gpu_ms']:.3f} ({r['attn_fwd_gpu_ms']:.3f}+{r['attn_bwd_gpu_ms']:.3f})")
        table.add_row(label, backends, f"{r['median_ms']:.2f}", _num(r.get("step_gpu_ms"), ".3f"),
                      _num(r.get("step_gpu_x_kerple"), ".2f"), attn, _num(r.get("attn_x_sdpa"), ".2f"),
                      f"{r['tokens_per_s']:.0f}", _num(r["peak_gib"], ".2f"),
                      *([_num(r.get("step_gpu_x_unmasked"), ".2f")] if packed else []))
    return table


def _train_step_caption(result: dict) -> str:
    s = result["settings"]
    if not s.get("profile_steps"):
        return "Wall: median of synchronized steps (no torch.profiler figures in this result)."
    text = (f"GPU times from torch.profiler kernel time, per step (mean of {s['profile_steps']} profiled steps): "
            f"the figures that compare GPU cost. Wall times (median of synchronized steps) also count the host "
            f"launching the kernels: host-bound wherever kernels are short, as the attention's are at training "
            f"shapes. attn = the kernels of the attention's forward and backward ranges, every layer; X vs SDPA = "
            f"attn over {result.get('sdpa_reference')}'s.")
    if s.get("documents"):
        text += (f" A row of N docs packs each window from N documents (document ids, positions restarting per "
                 f"document; the ratios among rows of one packing); x unmasked = its step GPU ms over the "
                 f"method's unmasked row's.")
    if s["device"] != "cuda":
        text += " No GPU here: the GPU columns hold torch.profiler's CPU op self time."
    return text


def short_kernel_name(name: str, width: int = 100) -> str:
    """A kernel's name without the namespaces and return type that make CUDA template names long,
    cut to `width` characters (the JSON keeps the full name)."""
    for noise in ("void ", "at::native::", "(anonymous namespace)::", "at::"):
        name = name.replace(noise, "")
    return name if len(name) <= width else name[:width - 3] + "..."


def other_kernels_table(result: dict) -> Table:
    """A train_step_bench result's other_kernels (its top_kernels option): per method, the kernels
    outside the attention's ranges with the most time per step, and the rest of that time."""
    table = Table(f"kernels outside the attention per step | commit {result.get('git_commit')}",
                  [*columns("method", "pass"), *columns("ms/step", "calls/step", right_from=0), *columns("kernel")],
                  caption="pass: fwd = the forward, loss and optimizer step; bwd = the backward (the autograd "
                          "thread); - = both on one thread (a CPU). The last line of a method: the rest of "
                          "its time outside the attention (other_gpu_ms).")
    for r in result["rows"]:
        if not r.get("other_kernels"):
            continue
        label = f"{r['method']} ({r['documents']} docs)" if r.get("documents") else r["method"]
        for k in r["other_kernels"]:
            table.add_row(label, k["pass"], f"{k['ms_per_step']:.3f}", f"{k['calls_per_step']:g}",
                          short_kernel_name(k["name"]))
        rest = r["other_gpu_ms"] - sum(k["ms_per_step"] for k in r["other_kernels"])
        table.add_row(label, "", f"{rest:.3f}", "", f"(the rest of other_gpu_ms {r['other_gpu_ms']:.3f})")
    return table


def decode_table(result: dict) -> Table:
    """A decode_bench result, one row per method, mode, context and batch size; x GPT-2 is the row's
    ms/token over transformers' GPT-2 (compiled, or static on a CPU) at the same context and batch."""
    s = result["settings"]
    m = s["model"]
    table = Table(f"{_versions(result)} | transformers {result.get('transformers')} | preset {s['preset']} "
                  f"(L={m['n_layer']} H={m['n_head']} C={m['d_model']} V={s['vocab_size']}) {s['precision']} | "
                  f"{s['repeats']} x {s['steps']} steps | commit {result.get('git_commit')}",
                  columns(*DECODE_COLUMNS, right_from=2),
                  caption="One decode step with the cache already holding `context` tokens; the median of the runs, "
                          "each timed without a host sync.")
    for r in result["rows"]:
        head = [r["method"], r["mode"], str(r["context"]), str(r["batch"])]
        if r["status"] != "ok":
            table.add_row(*head, r["status"].split(" (")[0], "", "", "")
            continue
        table.add_row(*head, f"{r['ms_per_token']:.3f}", f"{r['tokens_per_s']:,.1f}", _num(r.get("x_gpt2"), ".2f"),
                      _num(r.get("peak_gib"), ".2f"))
    return table
