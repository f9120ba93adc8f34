"""`lenx bench`: attention kernels against fused SDPA, or whole training steps (--train-step)."""

from pathlib import Path
import sys

import typer

from . import _command, _fail, _parse_ints, _parse_methods, _user_errors


def _parse_names(text: str | None, option: str) -> list[str] | None:
    """Comma-separated names; "none" for none; None when the option was not given."""
    from ..config import ConfigError

    if text is None:
        return None
    if text.strip().lower() == "none":
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"{option} names nothing: {text!r} (none for none)")
    return names


def _parse_backend_for(text: str) -> dict[str, str]:
    """'m1=b1,m2=b2' -> {m1: b1, m2: b2} (ConfigError on a malformed or repeated entry)."""
    from ..config import ConfigError

    forced = {}
    for item in text.split(","):
        method, sep, backend = item.partition("=")
        if not sep or not method.strip() or not backend.strip():
            raise ConfigError(f"--backend-for takes METHOD=BACKEND pairs separated by commas, not {item!r}")
        if method.strip() in forced:
            raise ConfigError(f"--backend-for names {method.strip()!r} twice")
        forced[method.strip()] = backend.strip()
    return forced


@_command("bench")
def bench_cmd(methods: str = typer.Option(None, help="comma-separated (default: sdpa,kerple,dapev2-kerple,stickbreaking; "
                                          "with --train-step: sdpa,rope,alibi,kerple,fire,dape-kerple,dapev2-kerple; "
                                          "with --decode: rope,kerple,dapev2-kerple,stickbreaking)"),
              backends: str = typer.Option("sdpa,flex,triton,chunked,dense", help="comma-separated"),
              lengths: str = typer.Option("512,2048,8192,16384,32768", help="comma-separated sequence lengths"),
              batch: int = typer.Option(None, help="batch size (default 1; with --train-step 32)"),
              heads: int = typer.Option(12), head_dim: int = typer.Option(64),
              window: int = typer.Option(0, help="kernel rows with a sliding window of this many keys "
                                                 "(model.window; 0: none)"),
              gpu_time: int = typer.Option(0, "--gpu-time",
                                           help="kernel rows: also profile N calls per mode with torch.profiler "
                                                "for the GPU kernel time of one call (fwd_gpu_ms, fwdbwd_gpu_ms; "
                                                "judges a row the host's launches bound); 0: none"),
              documents: int = typer.Option(None, help="pack each sequence from this many documents (document ids, "
                                                       "positions restarting per document): the kernel rows with "
                                                       "them; with --train-step each method's packed step beside "
                                                       "its unmasked one"),
              commit: str = typer.Option(None, help="git commit to record (default: this checkout's)"),
              out: Path = typer.Option(None, "--out", "-o",
                                       help="JSON output (default bench.json; with --train-step bench_train_step.json, "
                                            "with --decode bench_decode.json); it may replace only a file lenx "
                                            "bench wrote"),
              force: bool = typer.Option(False, "--force", help="replace the default output file of an earlier "
                                                                "benchmark (a file named with --out is replaced "
                                                                "when lenx bench wrote it)"),
              train_step: bool = typer.Option(False, "--train-step",
                                              help="time whole training steps of the --preset model per method "
                                                   "(the DAPE V2 paper's table 7) instead of the attention kernels"),
              backend_for: str = typer.Option(None, "--backend-for",
                                              help="--train-step: force attention backends, comma-separated "
                                                   "METHOD=BACKEND (e.g. dapev2-kerple=chunked); default: the planner's"),
              decode: bool = typer.Option(False, "--decode",
                                          help="time one decode step (ms/token, tokens/s) of the --preset model per "
                                               "method, context and batch size, eager and as a CUDA graph, beside "
                                               "transformers' GPT-2 of the same shape, instead of the attention kernels"),
              contexts: str = typer.Option(None, help="--decode: comma-separated tokens in the cache (default "
                                                      "1024,8192,32768)"),
              batches: str = typer.Option(None, help="--decode: comma-separated batch sizes (default 1,8)"),
              modes: str = typer.Option(None, help="--decode: lenx's steps, comma-separated among eager, static, graph, "
                                                   "compile (default eager,graph; on a CPU eager,static)"),
              gpt2_modes: str = typer.Option(None, "--gpt2-modes",
                                             help="--decode: GPT-2's steps among eager, static, compile, or none "
                                                  "(default eager,compile; on a CPU eager,static)"),
              repeats: int = typer.Option(3, help="--decode: timed runs of --steps steps per row (the median counts)"),
              preset: str = typer.Option("125m", help="--train-step and --decode: the model preset"),
              seq_len: int = typer.Option(512, help="--train-step: training sequence length"),
              steps: int = typer.Option(None, help="--train-step: timed steps per method (default 20); --decode: "
                                                   "steps per timed run (default 32)"),
              warmup: int = typer.Option(None, help="--train-step, --decode: untimed steps before them (default 5, 4)"),
              profile_steps: int = typer.Option(4, "--profile-steps",
                                                help="--train-step: steps profiled after the timed ones for GPU kernel "
                                                     "times (the step's and the attention's); 0: none"),
              top_kernels: int = typer.Option(0, "--top-kernels",
                                              help="--train-step: also list each method's N costliest kernels outside "
                                                   "the attention (other_kernels in the JSON; 0: none)"),
              device: str = typer.Option("cuda", help="cuda, or cpu with --train-step or --decode"),
              no_memory_check: bool = typer.Option(False, "--no-memory-check",
                                                   help="--train-step: time a step even when the estimate of its "
                                                        "peak memory exceeds what the device has available")):
    """Time attention kernels against fused SDPA on the GPU, whole training steps, or decoding.

    Forward and forward+backward time and peak memory per method, backend and length on the current
    GPU, with ratios against fused causal SDPA in the same run (needs CUDA). --gpu-time N adds each
    mode's GPU kernel time of one call (torch.profiler, mean of N calls): where launching a call's
    small ops takes the host longer than the GPU takes to run them, the wall time is the host's.

    With --train-step: time per training step and peak memory of the --preset model per method, and
    from torch.profiler the GPU kernel time of a step (x Kerple's) and of its attention, forward +
    backward (X vs SDPA's): the figures that count, as wall times also count the host launching kernels.

    With --train-step, --top-kernels N adds a table of each method's N costliest kernels outside the
    attention, and --documents N also runs each method's step with every window packed from N documents.

    With --decode: ms per token and tokens/s of one decode step of the --preset model per method,
    context and batch size (the cache already full), eager and as one CUDA graph, with transformers'
    GPT2LMHeadModel of the same shape (eager, and its static cache compiled) timed in the same run;
    a context that does not fit in memory is recorded as skipped.

    The JSON output never replaces a file that lenx bench did not write; an earlier benchmark's file
    at the default path is replaced only with --force (as lenx compare does with compare.json).
    """
    import torch

    from ..attention import parse_method
    from ..bench.common import check_documents, check_out
    from ..bench.kernels import run_bench
    from ..bench.train_step import TRAIN_STEP_METHODS, train_step_bench
    from ..config import ConfigError
    from ..fileio import check_writable_file
    from ..report.bench_tables import bench_table, other_kernels_table, train_step_table
    from ..report.tables import show
    from ..runinfo import git_commit

    try:
        if window < 0 or (window and (train_step or decode)):
            raise ConfigError(f"--window takes a number of keys >= 0 (got {window}) and applies to the kernel rows "
                              "only (not to --train-step or --decode)")
        if gpu_time < 0 or (gpu_time and (train_step or decode)):
            raise ConfigError(f"--gpu-time takes a number of profiled calls >= 0 (got {gpu_time}) and applies to the "
                              "kernel rows only (--train-step profiles with --profile-steps)")
        if documents is not None and decode:
            raise ConfigError("--documents applies to the kernel rows and --train-step (a decoded prompt is one document)")
        if train_step and decode:
            raise ConfigError("--train-step and --decode are two benchmarks: give one of them")
        if top_kernels and not train_step:
            raise ConfigError("--top-kernels applies to --train-step")
        if top_kernels < 0 or (top_kernels and profile_steps < 1):
            raise ConfigError(f"--top-kernels takes a number of kernels >= 0 (got {top_kernels}) and needs "
                              f"--profile-steps of 1 or more (got {profile_steps})")
        length_list = _parse_ints(lengths, "--lengths")
        if documents is not None:
            check_documents(documents, seq_len if train_step else min(length_list))
        if methods and not (train_step or decode) and any(
                m.strip() != "sdpa" and parse_method(m).temperature for m in methods.split(",") if m.strip()):
            raise ConfigError("a query temperature scales q before the attention kernels, which it leaves as they "
                              "are: time it in whole steps (--train-step or --decode), beside its method")
        decode_only = [name for name, value in (("--contexts", contexts), ("--batches", batches), ("--modes", modes),
                                                ("--gpt2-modes", gpt2_modes)) if value is not None]
        if decode_only and not decode:
            raise ConfigError(f"{', '.join(decode_only)} apply to --decode")
        if device not in ("cuda", "cpu") or (device == "cpu" and not (train_step or decode)):
            raise ConfigError("--device must be cuda (or cpu with --train-step or --decode: the kernel benchmark "
                              "times GPU kernels)")
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("lenx bench needs a CUDA device (it times GPU kernels; --train-step and --decode also "
                              "run with --device cpu)")
        if decode and batch is not None:
            raise ConfigError("--decode takes its batch sizes as --batches (comma-separated), not --batch")
        forced = _parse_backend_for(backend_for) if backend_for else {}
        if forced and not train_step:
            raise ConfigError("--backend-for applies to --train-step (the kernel benchmark takes --backends)")
        if no_memory_check and not train_step:
            raise ConfigError("--no-memory-check applies to --train-step")
        # before any timing: results that cannot be saved are not measured
        named = out is not None
        out = out or Path("bench_train_step.json" if train_step else "bench_decode.json" if decode else "bench.json")
        check_out(out, named, force)
        check_writable_file(out, "--out")
    except _user_errors() as e:
        _fail(e)
    if decode:
        from ..bench.decode import BATCHES, CONTEXTS, DECODE_METHODS, decode_bench
        from ..report.bench_tables import decode_table

        try:
            result = decode_bench(_parse_methods(methods) if methods else DECODE_METHODS,
                                  _parse_ints(contexts, "--contexts") or CONTEXTS,
                                  _parse_ints(batches, "--batches") or BATCHES, preset=preset,
                                  modes=_parse_names(modes, "--modes"), gpt2_modes=_parse_names(gpt2_modes, "--gpt2-modes"),
                                  steps=steps or 32, warmup=4 if warmup is None else warmup, repeats=repeats,
                                  device=device, commit=commit, command=" ".join(sys.argv), out_path=str(out))
        except _user_errors() as e:
            _fail(e)
        show([decode_table(result)])
        print(f"wrote {out}")
        return
    if train_step:
        try:
            result = train_step_bench((methods or ",".join(TRAIN_STEP_METHODS)).split(","), preset=preset,
                                      seq_len=seq_len, batch_size=batch or 32, steps=steps or 20,
                                      warmup=5 if warmup is None else warmup, device=device,
                                      backend_overrides=forced, profile_steps=profile_steps, commit=commit,
                                      command=" ".join(sys.argv), out_path=str(out),
                                      memory_check=not no_memory_check, documents=documents or 0,
                                      top_kernels=top_kernels)
        except _user_errors() as e:
            _fail(e)
        show([train_step_table(result)] + ([other_kernels_table(result)] if top_kernels else []))
        print(f"wrote {out}")
        return
    result = run_bench(methods=(methods or "sdpa,kerple,dapev2-kerple,stickbreaking").split(","),
                       lengths=length_list, batch=batch or 1,
                       heads=heads, head_dim=head_dim, backends=backends.split(","), out_path=str(out),
                       commit=commit or git_commit(), command=" ".join(sys.argv), window=window,
                       documents=documents or 0, gpu_time=gpu_time)
    show([bench_table(result)])
    print(f"wrote {out}")
