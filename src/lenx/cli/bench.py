"""`lenx bench`: attention kernels against fused SDPA, or whole training steps (--train-step)."""

from pathlib import Path
import sys

import typer

from . import _command, _fail, _parse_ints, _user_errors


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
                                          "with --train-step: sdpa,rope,alibi,kerple,fire,dape-kerple,dapev2-kerple)"),
              backends: str = typer.Option("sdpa,flex,triton,chunked,dense", help="comma-separated"),
              lengths: str = typer.Option("512,2048,8192,16384,32768", help="comma-separated sequence lengths"),
              batch: int = typer.Option(None, help="batch size (default 1; with --train-step 32)"),
              heads: int = typer.Option(12), head_dim: int = typer.Option(64),
              commit: str = typer.Option(None, help="git commit to record (default: this checkout's)"),
              out: Path = typer.Option(None, "--out", "-o",
                                       help="JSON output (default bench.json; with --train-step bench_train_step.json)"),
              train_step: bool = typer.Option(False, "--train-step",
                                              help="time whole training steps of the --preset model per method "
                                                   "(the DAPE V2 paper's table 7) instead of the attention kernels"),
              backend_for: str = typer.Option(None, "--backend-for",
                                              help="--train-step: force attention backends, comma-separated "
                                                   "METHOD=BACKEND (e.g. dapev2-kerple=chunked); default: the planner's"),
              preset: str = typer.Option("125m", help="--train-step: the model preset"),
              seq_len: int = typer.Option(512, help="--train-step: training sequence length"),
              steps: int = typer.Option(20, help="--train-step: timed steps per method"),
              warmup: int = typer.Option(5, help="--train-step: untimed steps before them"),
              profile_steps: int = typer.Option(4, "--profile-steps",
                                                help="--train-step: steps profiled after the timed ones for GPU kernel "
                                                     "times (the step's and the attention's); 0: none"),
              device: str = typer.Option("cuda", help="cuda, or cpu with --train-step only")):
    """Time attention kernels against fused SDPA on the GPU, or whole training steps.

    Forward and forward+backward time and peak memory per method, backend and length on the current
    GPU, with ratios against fused causal SDPA in the same run (needs CUDA).

    With --train-step: time per training step and peak memory of the --preset model per method, and
    from torch.profiler the GPU kernel time of a step (x Kerple's) and of its attention, forward +
    backward (X vs SDPA's): the figures that count, as wall times also count the host launching kernels.
    """
    import torch

    from ..bench.kernels import run_bench
    from ..bench.train_step import TRAIN_STEP_METHODS, train_step_bench
    from ..config import ConfigError
    from ..fileio import check_writable_file
    from ..report.bench_tables import bench_table, train_step_table
    from ..report.tables import show
    from ..runinfo import git_commit

    try:
        if device not in ("cuda", "cpu") or (device == "cpu" and not train_step):
            raise ConfigError("--device must be cuda (or cpu with --train-step: the kernel benchmark times GPU kernels)")
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("lenx bench needs a CUDA device (it times GPU kernels; --train-step also runs with --device cpu)")
        length_list = _parse_ints(lengths, "--lengths")
        forced = _parse_backend_for(backend_for) if backend_for else {}
        if forced and not train_step:
            raise ConfigError("--backend-for applies to --train-step (the kernel benchmark takes --backends)")
        # before any timing: results that cannot be saved are not measured
        out = out or Path("bench_train_step.json" if train_step else "bench.json")
        check_writable_file(out, "--out")
    except _user_errors() as e:
        _fail(e)
    if train_step:
        try:
            result = train_step_bench((methods or ",".join(TRAIN_STEP_METHODS)).split(","), preset=preset,
                                      seq_len=seq_len, batch_size=batch or 32, steps=steps, warmup=warmup, device=device,
                                      backend_overrides=forced, profile_steps=profile_steps, commit=commit,
                                      command=" ".join(sys.argv),
                                      out_path=str(out))
        except _user_errors() as e:
            _fail(e)
        show([train_step_table(result)])
        print(f"wrote {out}")
        return
    result = run_bench(methods=(methods or "sdpa,kerple,dapev2-kerple,stickbreaking").split(","),
                       lengths=length_list, batch=batch or 1,
                       heads=heads, head_dim=head_dim, backends=backends.split(","), out_path=str(out),
                       commit=commit or git_commit(), command=" ".join(sys.argv))
    show([bench_table(result)])
    print(f"wrote {out}")
