"""The `lenx` command: a thin layer over the library functions."""

from pathlib import Path
import json
import sys

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="lenx: train on short sequences, evaluate at long ones, compare attention variants.")

ConfigOpt = typer.Option("tiny", "--config", "-c", help="a TOML file or a preset name (tiny, small, 125m, 350m)")
SetOpt = typer.Option(None, "--set", "-s", help="dotted override, repeatable: --set model.method=kerple")


def _user_errors(*extra: type[Exception]) -> tuple[type[Exception], ...]:
    """The errors a command reports in one line; `extra`: those of the training commands, which
    alone import lenx.train and lenx.sweep."""
    from .attention.methods import UnknownMethodError
    from .checkpoint import CheckpointError
    from .config import ConfigError
    from .data import DataError

    return (ConfigError, DataError, CheckpointError, UnknownMethodError, FileNotFoundError, *extra)


def _fail(e: Exception):
    from .distributed import launched_info

    info = launched_info()
    where = f"[rank {info.rank}/{info.world}] " if info.enabled else ""  # under torchrun: which process
    typer.secho(f"{where}error: {e}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _parse_lengths(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        _fail(ValueError(f"--lengths must be comma-separated integers, got {text!r}"))


@app.command("list")
def list_methods():
    """Every method name with its description and the backends that can run it, then every CHE
    task (`lenx che --tasks`) with its Chomsky level and chance accuracy."""
    import torch
    from rich.console import Console
    from rich.table import Table

    from .attention import Attention, AttentionConfig, all_methods
    from .attention.backends import BACKENDS, unsupported_reason
    from .tasks import TASKS

    table = Table(title="lenx methods: names read \\[processor-]\\[normaliser-]base")
    for col in ("method", "description", "backends (CPU)", "backends (CUDA)"):
        table.add_column(col)
    for name in all_methods():
        attn = Attention(AttentionConfig(method=name), 4, 64)
        cols = []
        for dev in ("cpu", "cuda"):
            ok = [b for b in BACKENDS if unsupported_reason(b, attn.parts, torch.device(dev)) is None]
            cols.append(", ".join(b for b in ok if not (dev == "cpu" and b == "triton")))
        table.add_row(name, attn.spec.description, *cols)
    console = Console()
    console.print(table)

    tasks = Table(title="CHE tasks for `lenx che --tasks`",
                  caption="level (Chomsky hierarchy): R regular, DCF deterministic context-free, CS "
                          "context-sensitive; chance: the accuracy of uniform guessing")
    tasks.add_column("task", no_wrap=True)  # a name cut short could not be typed back
    tasks.add_column("level")
    tasks.add_column("chance", justify="right")
    for name, task in TASKS.items():
        tasks.add_row(name, task.level, f"{task.chance:.3g}")
    console.print(tasks)


@app.command()
def prepare(corpus: str = typer.Argument(..., help="tech, books, synthetic, or a new name with --from"),
            from_path: Path = typer.Option(None, "--from", help="a folder of text files or a JSONL file with a 'text' field"),
            root: Path = typer.Option(Path("data"), help="where corpora live"),
            tokenizer: str = typer.Option("bpe", help="bpe (trained on the train split) or gpt2"),
            vocab_size: int = typer.Option(16384, help="BPE vocabulary size"),
            seed: int = typer.Option(0),
            force: bool = typer.Option(False, help="rebuild even if the corpus is already prepared with these settings")):
    """Build a corpus: fetch, extract, dedupe, split by document, tokenize, pack."""
    from .data import prepare_corpus

    try:
        manifest = prepare_corpus(corpus, root, from_path=from_path, tokenizer=tokenizer, vocab_size=vocab_size,
                                  seed=seed, force=force)
    except _user_errors() as e:
        _fail(e)
    summary = {k: v for k, v in manifest.items() if k not in ("sources",)}
    print(json.dumps(summary, indent=2))


@app.command("train")
def train_cmd(config: str = ConfigOpt, set_: list[str] = SetOpt,
              out: Path = typer.Option(None, "--out", "-o", help="run directory (default runs/<corpus>-<method>-T<len>)"),
              resume: Path = typer.Option(None, "--resume", help="continue this run directory from its last checkpoint"),
              progress: bool = typer.Option(True, help="show a progress bar")):
    """Train a model (single process, or under torchrun for several GPUs:
    `torchrun --nproc-per-node N -m lenx train ...`, DDP by default, `--set train.parallel=fsdp` for FSDP2)."""
    from . import distributed
    from .config import ConfigError, load_config
    from .train import TrainingDiverged, train

    # Under torchrun a failing rank reports its error and exits non-zero; torchrun then stops the
    # other ranks, which may be waiting for it in a collective. The process group is shut down only
    # after success: shutting NCCL down can itself wait for peers, and exiting frees it anyway.
    try:
        if resume is not None:
            if set_:  # rather than ignoring them silently
                raise ConfigError("--resume continues the run with its saved config.toml; --set cannot change it "
                                  f"(edit {resume / 'config.toml'} instead, e.g. train.parallel)")
            summary = train(None, resume, resume=True, progress=progress)
        else:
            cfg = load_config(config, set_ or [])
            run_dir = out or Path("runs") / f"{cfg.data.corpus}-{cfg.model.method}-T{cfg.train.seq_len}"
            summary = train(cfg, run_dir, progress=progress)
    except _user_errors(TrainingDiverged) as e:
        _fail(e)
    distributed.teardown()
    if distributed.launched_info().is_main:
        print(json.dumps(summary))


@app.command("eval")
def eval_cmd(run: Path = typer.Argument(..., help="a run directory"),
             lengths: str = typer.Option(None, help="comma-separated, e.g. 128,256,512 (default: powers of two from the training length to eval.max_length)"),
             windows: int = typer.Option(None, help="windows per length (default eval.windows)"),
             scored: int = typer.Option(None, help="score the last N tokens (default eval.scored, 256)"),
             device: str = typer.Option("auto"), backend: str = typer.Option(None, help="force an attention backend"),
             progress: bool = typer.Option(True)):
    """Perplexity of the last 256 tokens at every length, DeltaP, and full-sequence perplexity."""
    from .evaluate import evaluate

    try:
        result = evaluate(run, _parse_lengths(lengths), windows, scored, device, backend, progress=progress)
    except _user_errors() as e:
        _fail(e)
    print_eval_table([result])
    print(f"wrote {Path(run) / 'eval.json'}")


def print_eval_table(results: list[dict]):
    from rich.console import Console
    from rich.table import Table

    lengths = sorted({int(L) for r in results for L in r["results"]})
    table = Table(title=f"perplexity of the last {results[0]['scored']} tokens (ΔP in brackets); {results[0]['window_note']}")
    table.add_column("method")
    for L in lengths:
        table.add_column(str(L), justify="right")
    for r in results:
        cells = []
        for L in lengths:
            row = r["results"].get(str(L))
            if row is None:
                cells.append("")
                continue
            cells.append(f"{row['ppl']:.2f}" + (f" ({row['delta_p']:+.2f})" if "delta_p" in row else ""))
        table.add_row(r["method"], *cells)
    Console().print(table)


@app.command("sweep")
def sweep_cmd(methods: str = typer.Option(..., help="comma-separated method names"), config: str = ConfigOpt,
              set_: list[str] = SetOpt, out: Path = typer.Option(None, "--out", "-o", help="sweep directory"),
              jobs: int = typer.Option(1, "--jobs", "-j", min=0, help="methods run at once, each in its own process "
                                       "(one GPU each via CUDA_VISIBLE_DEVICES; logs in <run>/sweep.log); "
                                       "0 = one per visible GPU"),
              progress: bool = typer.Option(True)):
    """Train and evaluate several methods with the same data, seed and budget; table and plots."""
    from .attention import parse_method
    from .config import load_config
    from .sweep import SweepError, sweep
    from .train import TrainingDiverged

    try:
        names = [parse_method(m).name for m in methods.split(",") if m]
        cfg = load_config(config, set_ or [])
        out = out or Path("runs") / f"sweep-{cfg.data.corpus}-T{cfg.train.seq_len}"
        result = sweep(names, cfg, out, progress=progress, jobs=jobs)
    except _user_errors(TrainingDiverged, SweepError) as e:
        _fail(e)
    print_eval_table(result["results"])
    print("figures: " + ", ".join(result["figures"]))


@app.command("plot")
def plot_cmd(source: Path = typer.Argument(..., help="a folder (every figure under it is re-drawn from its JSON), a "
                                           "results.json / eval.json / che.json / attention JSON file, or a run "
                                           "directory with --attention"),
             out: Path = typer.Option(None, "--out", "-o", help="output folder (default: next to each JSON file)"),
             attention: bool = typer.Option(False, help="draw attention maps (scores, bias, processed) of one run, "
                                                        "and save them as JSON next to the figure"),
             length: int = typer.Option(64, help="input length for --attention"),
             layer: int = typer.Option(0), head: int = typer.Option(0)):
    """Re-draw the figures from saved JSON (or attention maps from a checkpoint)."""
    from . import plot

    try:
        if attention:
            from .evaluate import attention_maps, save_attention_maps

            # the checkpoint is read once, into JSON; the figure is drawn from that file, as
            # `lenx plot FOLDER` re-draws it later without the checkpoint
            maps = attention_maps(source, layer=layer, head=head, length=length)
            png = (out or source) / f"attention_L{layer}_H{head}.png"
            saved = save_attention_maps(maps, png.with_suffix(".json"))
            print(saved)
            print(plot.draw_attention_maps(plot.load_attention_maps(saved), png))
            return
        for path in plot.redraw(source, out):
            print(path)
    except (*_user_errors(), plot.PlotError) as e:
        _fail(e)


@app.command("che")
def che_cmd(tasks: str = typer.Option(None, help="comma-separated task names (default: all 15)"),
            methods: str = typer.Option(None, help="comma-separated methods (default: rope,alibi,kerple,dape-kerple,dapev2-kerple)"),
            preset: str = typer.Option("smoke", help="smoke (CPU, minutes), gpu (a few minutes per pair), paper (200k steps)"),
            steps: int = typer.Option(None, help="training steps per task-method-seed"),
            seeds: str = typer.Option(None, help="comma-separated seeds"),
            test_max_length: int = typer.Option(None, help="longest test length (default 500; smoke: 56)"),
            test_length_step: int = typer.Option(None, help="test every Nth length from 41 (default 1; smoke: 5)"),
            test_samples: int = typer.Option(None, help="test samples per length (default 512)"),
            merge: str = typer.Option(None, help="comma-separated CHE output folders: merge their runs into --out "
                                                 "instead of training (other options are ignored)"),
            out: Path = typer.Option(Path("runs/che"), "--out", "-o",
                                     help="output folder; running again with the same one resumes, skipping done runs"),
            progress: bool = typer.Option(True)):
    """The Chomsky-hierarchy length-generalisation benchmark: train on lengths 1..40, test on 41..500.
    `lenx list` names the tasks with their Chomsky level and chance accuracy."""
    from .attention.methods import UnknownMethodError
    from .che import make_config, merge_che, run_che
    from .tasks import UnknownTaskError

    split = lambda text: [x for x in text.split(",") if x] if text else None  # noqa: E731
    try:
        if merge:
            result = merge_che([Path(p) for p in split(merge)], out)
        else:
            cfg = make_config(preset, tasks=split(tasks), methods=split(methods), steps=steps,
                              seeds=[int(s) for s in split(seeds)] if seeds else None,
                              test_max_length=test_max_length, test_length_step=test_length_step,
                              test_samples=test_samples)
            result = run_che(cfg, out, progress=progress)
    except (UnknownMethodError, UnknownTaskError, ValueError, FileNotFoundError) as e:
        _fail(e)
    print((out / "che.md").read_text())
    print(f"wrote {out / 'che.json'}, {out / 'che_per_length.png'}")
    return result


@app.command("bench")
def bench_cmd(methods: str = typer.Option(None, help="comma-separated (default: sdpa,kerple,dapev2-kerple,stickbreaking; "
                                          "with --train-step: rope,alibi,kerple,fire,dape-kerple,dapev2-kerple)"),
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
              preset: str = typer.Option("125m", help="--train-step: the model preset"),
              seq_len: int = typer.Option(512, help="--train-step: training sequence length"),
              steps: int = typer.Option(20, help="--train-step: timed steps per method"),
              warmup: int = typer.Option(5, help="--train-step: untimed steps before them"),
              device: str = typer.Option("cuda", help="cuda, or cpu with --train-step only")):
    """Time forward and forward+backward and peak memory per method, backend and length on the
    current GPU, with ratios against fused causal SDPA in the same run (needs CUDA). With
    --train-step: time per training step and peak memory of a whole model per method, with ratios
    against dapev2-kerple."""
    import torch

    from .bench import TRAIN_STEP_METHODS, print_bench_table, print_train_step_table, run_bench, train_step_bench
    from .runinfo import git_commit

    if device not in ("cuda", "cpu") or (device == "cpu" and not train_step):
        _fail(ValueError("--device must be cuda (or cpu with --train-step: the kernel benchmark times GPU kernels)"))
    if device == "cuda" and not torch.cuda.is_available():
        _fail(RuntimeError("lenx bench needs a CUDA device (it times GPU kernels; --train-step also runs with --device cpu)"))
    if train_step:
        out = out or Path("bench_train_step.json")
        try:
            result = train_step_bench((methods or ",".join(TRAIN_STEP_METHODS)).split(","), preset=preset,
                                      seq_len=seq_len, batch_size=batch or 32, steps=steps, warmup=warmup, device=device,
                                      commit=commit, command=" ".join(sys.argv), out_path=str(out))
        except _user_errors() as e:
            _fail(e)
        print_train_step_table(result)
        print(f"wrote {out}")
        return
    out = out or Path("bench.json")
    result = run_bench(methods=(methods or "sdpa,kerple,dapev2-kerple,stickbreaking").split(","),
                       lengths=[int(x) for x in lengths.split(",")], batch=batch or 1,
                       heads=heads, head_dim=head_dim, backends=backends.split(","), out_path=str(out),
                       commit=commit or git_commit(), command=" ".join(sys.argv))
    print_bench_table(result)
    print(f"wrote {out}")


@app.command()
def demo(out: Path = typer.Option(Path("runs/demo"), "--out", "-o"),
         steps: int = typer.Option(300, help="training steps per method")):
    """The main job on the embedded synthetic corpus (CPU, minutes): train rope, kerple and
    dapev2-kerple at length 64, evaluate up to 8x that, print the table and the plot paths."""
    from .config import load_config
    from .sweep import SweepError, sweep
    from .train import TrainingDiverged

    cfg = load_config("tiny", [f"train.steps={steps}"])
    try:
        result = sweep(["rope", "kerple", "dapev2-kerple"], cfg, out)
    except _user_errors(TrainingDiverged, SweepError) as e:
        _fail(e)
    print_eval_table(result["results"])
    print(f"table: {out / 'results.md'}")
    print("figures: " + ", ".join(result["figures"]))


def main():
    app()


if __name__ == "__main__":
    sys.exit(main())
