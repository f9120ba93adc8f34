"""The `lenx` command: a thin layer over the library functions.

Every command checks all of its input before it starts any work, and reports a user error as one
line on stderr with exit code 2.
"""

import inspect
from pathlib import Path
import json
import sys
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="lenx: train on short sequences, evaluate at long ones, compare attention variants.")

ConfigOpt = typer.Option("tiny", "--config", "-c", help="a TOML file or a preset name (tiny, small, 125m, 350m)")
SetOpt = typer.Option(None, "--set", "-s", help="dotted override, repeatable: --set model.method=kerple")
ProgressOpt = typer.Option(None, "--progress/--no-progress",
                           help="progress bars (default: only when stderr is a terminal, so a piped log gets none)")


def _command(name: str | None = None):
    """app.command with the docstring's paragraphs reflowed. Typer keeps the line breaks of every
    paragraph but the first, which then show as lines broken mid-sentence at any terminal width."""
    def register(fn):
        paragraphs = inspect.cleandoc(fn.__doc__).split("\n\n")
        return app.command(name, help="\n\n".join(" ".join(p.split()) for p in paragraphs))(fn)

    return register


def _user_errors(*extra: type[Exception]) -> tuple[type[Exception], ...]:
    """The errors a command reports in one line; `extra`: those of the training commands, which
    alone import lenx.training.loop and lenx.training.sweep."""
    from ..attention.methods import UnknownMethodError
    from ..config import ConfigError
    from ..data import DataError
    from ..fileio import OutputError
    from ..model.checkpoint import CheckpointError

    return (ConfigError, DataError, CheckpointError, UnknownMethodError, FileNotFoundError, OutputError, *extra)


def _fail(e: Exception):
    from ..training.distributed import launched_info

    info = launched_info()
    where = f"[rank {info.rank}/{info.world}] " if info.enabled else ""  # under torchrun: which process
    typer.secho(f"{where}error: {e}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _progress(flag: bool | None) -> bool:
    return sys.stderr.isatty() if flag is None else flag


def _parse_ints(text: str | None, option: str, low: int = 1) -> list[int] | None:
    """Comma-separated integers >= low, or None when the option was not given."""
    from ..config import ConfigError

    if text is None:
        return None
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(f"{option} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < low:
        raise ConfigError(f"{option} must be comma-separated integers >= {low}, got {text!r}")
    return values


def _parse_seeds(text: str | None) -> list[int] | None:
    """--seeds of sweep and che: integers >= 0, each once (a seed named twice would run twice and
    count as two), or None when not given."""
    from ..config import ConfigError

    seeds = _parse_ints(text, "--seeds", low=0)
    if seeds and len(set(seeds)) < len(seeds):
        raise ConfigError(f"--seeds names a seed more than once: {text!r}")
    return seeds


def _parse_methods(text: str) -> list[str]:
    """Canonical method names of a comma-separated list; each once, at least one."""
    from ..attention import parse_method
    from ..config import ConfigError

    names = [parse_method(m).name for m in text.split(",") if m.strip()]
    if not names:
        raise ConfigError(f"--methods names no method: {text!r}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"--methods names {', '.join(twice)} more than once")
    return names


def _run_config(run_dir: Path):
    """The config of a trained run directory (lenx.runs.run_config)."""
    from ..runs import run_config

    return run_config(run_dir)


@_command("list")
def list_methods():
    """List every method with the backends that run it, and every CHE task.

    A backend marked "forward only" runs there but has no backward (FlexAttention on the CPU), so it
    can evaluate but not train. Where the fused backend picks its kernel by the work (DAPE V2), the
    CUDA column says how; a run's meta.json records the kernels its layers ran ("kernels"). CHE tasks (`lenx che --tasks`) come with their
    Chomsky level and chance accuracy.
    """
    from ..report.list_tables import method_backends, methods_table, tasks_table
    from ..report.tables import show
    from ..tasks import TASKS

    show([methods_table(method_backends()), tasks_table(TASKS)])


@_command()
def prepare(corpus: str = typer.Argument(..., help="tech, books, synthetic, or a new name with --from"),
            from_path: Path = typer.Option(None, "--from", help="a folder of text files or a JSONL file with a 'text' field"),
            root: Path = typer.Option(Path("data"), help="where corpora live"),
            tokenizer: str = typer.Option("bpe", help="bpe (trained on the train split) or gpt2"),
            vocab_size: int = typer.Option(16384, help="BPE vocabulary size"),
            seed: int = typer.Option(0),
            long_test: int = typer.Option(0, "--long-test", help="reserve this many documents of at least "
                                          "--long-test-tokens tokens for the test split, so evaluation windows at "
                                          "long lengths can each come from a document of their own"),
            long_test_tokens: int = typer.Option(16384, "--long-test-tokens",
                                                 help="the size in tokens of a document that --long-test reserves"),
            force: bool = typer.Option(False, help="rebuild even if the corpus is already prepared with these "
                                       "settings, and replace a corpus of this name prepared with other settings "
                                       "(without it, that is an error; runs trained on the old corpus refuse the "
                                       "new one)"),
            allow_missing_sources: bool = typer.Option(False, help="build the corpus from the sources that could be "
                                                       "fetched when some cannot (the manifest lists the missing ones)"),
            skip_bad_records: bool = typer.Option(False, "--skip-bad-records",
                                                  help="--from a JSONL file: leave out the lines that are not a JSON "
                                                       "object with a string \"text\" (the manifest counts them) "
                                                       "instead of stopping at the first"),
            progress: Optional[bool] = ProgressOpt):
    """Build a corpus: fetch, extract, dedupe, split by document, tokenize, pack.

    Prints the manifest (without its sources) as JSON on stdout, and one line per split (documents,
    tokens, documents of >= 8192 and >= 16384 tokens) on stderr.
    """
    from ..data.build import prepare_corpus
    from ..fileio import check_writable_dir
    from ..report.corpus_summary import manifest_json, skipped_records, split_summary

    try:
        check_writable_dir(root, "--root")
        check_writable_dir(root / corpus, "the corpus folder")
        manifest = prepare_corpus(corpus, root, from_path=from_path, tokenizer=tokenizer, vocab_size=vocab_size,
                                  seed=seed, force=force, allow_missing_sources=allow_missing_sources,
                                  long_test=long_test, long_test_tokens=long_test_tokens, progress=_progress(progress),
                                  skip_bad_records=skip_bad_records)
    except _user_errors() as e:
        _fail(e)
    print(manifest_json(manifest))
    for line in split_summary(manifest) + skipped_records(manifest):
        typer.echo(line, err=True)


@_command("train")
def train_cmd(config: str = ConfigOpt, set_: list[str] = SetOpt,
              out: Path = typer.Option(None, "--out", "-o", help="run directory (default runs/<corpus>-<method>-T<len>)"),
              resume: Path = typer.Option(None, "--resume", help="continue this run directory from its last checkpoint"),
              progress: Optional[bool] = ProgressOpt):
    """Train a model, on one device or under torchrun on several GPUs.

    Several GPUs: `torchrun --nproc-per-node N -m lenx train ...` (DDP by default,
    `--set train.parallel=fsdp` for FSDP2).
    """
    from ..config import ConfigError, load_config
    from ..fileio import check_writable_dir
    from ..model import check_device
    from ..training import distributed
    from ..training.loop import TrainingDiverged, train

    # Under torchrun a failing rank reports its error and exits non-zero; torchrun then stops the
    # other ranks, which may be waiting for it in a collective. The process group is shut down only
    # after success: shutting NCCL down can itself wait for peers, and exiting frees it anyway.
    try:
        if resume is not None:
            if set_:  # rather than ignoring them silently
                raise ConfigError("--resume continues the run with its saved config.toml; --set cannot change it "
                                  f"(edit {resume / 'config.toml'} instead, e.g. train.parallel)")
            resumed = _run_config(resume)
            check_device(resumed, resumed.train.device)
            check_writable_dir(resume, "the run folder")
            summary = train(None, resume, resume=True, progress=_progress(progress))
        else:
            cfg = load_config(config, set_ or [])
            check_device(cfg, cfg.train.device)
            run_dir = out or Path("runs") / f"{cfg.data.corpus}-{cfg.model.method}-T{cfg.train.seq_len}"
            check_writable_dir(run_dir, "--out" if out else "the run folder")
            summary = train(cfg, run_dir, progress=_progress(progress))
    except _user_errors(TrainingDiverged) as e:
        _fail(e)
    distributed.teardown()
    if distributed.launched_info().is_main:
        print(json.dumps(summary))


@_command("eval")
def eval_cmd(run: Path = typer.Argument(..., help="a run directory"),
             lengths: str = typer.Option(None, help="comma-separated, e.g. 128,256,512 (default: powers of two from the training length to eval.max_length)"),
             windows: int = typer.Option(None, help="windows per length (default eval.windows)"),
             scored: int = typer.Option(None, help="score the last N tokens (default eval.scored, 256)"),
             device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N"),
             backend: str = typer.Option(None, help="force an attention backend"),
             step: int = typer.Option(None, help="evaluate the weights kept at this step (train.keep_every) "
                                                 "instead of the last checkpoint"),
             rope_scaling: str = typer.Option(None, help="evaluate a RoPE model with a context extension: pi, ntk, "
                                                         "dynamic-ntk or yarn (writes eval_rope-<scaling>.json)"),
             rope_scaling_factor: str = typer.Option(None, help="the scale s of --rope-scaling: auto (evaluation "
                                                                "length / training length, the default) or a number "
                                                                ">= 1; not with dynamic-ntk, which sets its own"),
             task: str = typer.Option(None, help="a retrieval task instead of perplexity: passkey or copy "
                                                 "(writes eval_<task>.json)"),
             depths: str = typer.Option(None, help="--task: comma-separated depths in [0, 1] (default 0,0.25,0.5,0.75,1)"),
             samples: int = typer.Option(None, help="--task: inputs per length and depth (default 8)"),
             progress: Optional[bool] = ProgressOpt):
    """Evaluate a run: perplexity at every length, ΔP and full-sequence perplexity.

    The perplexity of the last --scored tokens of the same windows at every length (the DAPE V2
    paper's protocol); writes eval.json into the run directory, keeping an earlier evaluation there
    with other settings beside it as eval.<key>.json. With --task, a retrieval task (passkey or copy
    at distance) over lengths x depths instead. The run's corpus must be the one it was trained on.
    """
    from dataclasses import replace

    from ..config import ConfigError, validate
    from ..evaluation.evaluate import evaluate, evaluate_task, result_name
    from ..fileio import check_writable_dir, check_writable_file
    from ..model import check_device
    from ..report.eval_tables import eval_table, task_table
    from ..report.tables import show

    try:
        cfg = _run_config(run)
        # before any work: an evaluation that cannot be saved is not started
        check_writable_dir(run, "the run folder")
        check_writable_file(Path(run) / result_name(step, rope_scaling, task), "the evaluation file")
        if backend:
            cfg = replace(cfg, model=replace(cfg.model, backend=backend))
            validate(cfg)
        check_device(cfg, device, key="--device", training=False)
        if rope_scaling_factor is not None:  # rather than ignoring it silently
            if rope_scaling is None:
                raise ConfigError("--rope-scaling-factor applies to --rope-scaling (pi, ntk or yarn), which is not given")
            if rope_scaling == "dynamic-ntk":
                raise ConfigError("--rope-scaling dynamic-ntk sets its scale from each input's length; "
                                  "--rope-scaling-factor does not apply to it")
        factor = _parse_factor(rope_scaling_factor or "auto")
        if task is not None:
            if windows is not None or scored is not None:
                raise ConfigError("--windows and --scored belong to the perplexity evaluation, not to --task")
            result = evaluate_task(run, task, _parse_ints(lengths, "--lengths"), _parse_floats(depths, "--depths"),
                                   samples, device, backend, step, rope_scaling, factor, progress=_progress(progress))
        else:
            if depths is not None or samples is not None:
                raise ConfigError("--depths and --samples belong to --task")
            result = evaluate(run, _parse_ints(lengths, "--lengths"), windows, scored, device, backend,
                              progress=_progress(progress), step=step, rope_scaling=rope_scaling,
                              rope_scaling_factor=factor)
    except _user_errors() as e:
        _fail(e)
    show([task_table(result) if task is not None else eval_table([result])])
    print(f"wrote {Path(run) / result_name(step, rope_scaling, task)}")


@_command("generate")
def generate_cmd(run: Path = typer.Argument(..., help="a run directory"),
                 prompt: str = typer.Option(None, help="the text to continue (token ids separated by spaces for the "
                                                       "token-level synthetic corpus)"),
                 prompt_file: Path = typer.Option(None, help="read the prompt from this file instead"),
                 max_new_tokens: int = typer.Option(100, help="tokens to generate"),
                 temperature: float = typer.Option(1.0, help="0 is greedy (deterministic)"),
                 top_k: int = typer.Option(0, help="sample among the k most likely tokens (0: all)"),
                 top_p: float = typer.Option(1.0, help="sample among the most likely tokens up to this probability"),
                 seed: int = typer.Option(0, help="seed of the sampling"),
                 max_context: int = typer.Option(32768, help="the cache limit: prompt plus new tokens"),
                 device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N"),
                 backend: str = typer.Option(None, help="force the attention backend of the prompt's forward")):
    """Continue a prompt with a trained run, token by token with a KV cache, streaming the text.

    The prompt is read with the run's attention backends; each new token then costs one row of
    attention per layer against the cached keys and values. Prints tokens/s at the end (on stderr).
    """
    from ..config import ConfigError
    from ..model import check_device
    from ..model.generate import generate_from_run

    try:
        if (prompt is None) == (prompt_file is None):
            raise ConfigError("give the prompt with --prompt TEXT or --prompt-file FILE (one of them)")
        if prompt_file is not None:
            if not prompt_file.is_file():
                raise ConfigError(f"--prompt-file {prompt_file} is not a file")
            prompt = prompt_file.read_text()
        check_device(_run_config(run), device, key="--device", training=False)
        out = generate_from_run(run, prompt, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                seed=seed, device=device, backend=backend, max_context=max_context,
                                write=lambda text: (sys.stdout.write(text), sys.stdout.flush()))
    except _user_errors() as e:
        _fail(e)
    print()
    print(f"{len(out['new_tokens'])} tokens after a {out['prompt_tokens']}-token prompt: {out['tokens_per_s']:.1f} "
          f"tokens/s ({out['method']}, {out['device']})", file=sys.stderr)


def _parse_factor(text: str) -> float:
    from ..config import ConfigError

    if text.strip().lower() == "auto":
        return 0.0
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"--rope-scaling-factor must be auto or a number, got {text!r}") from None


def _parse_floats(text: str | None, option: str) -> list[float] | None:
    from ..config import ConfigError

    if text is None:
        return None
    try:
        return [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(f"{option} must be comma-separated numbers, got {text!r}") from None


@_command("sweep")
def sweep_cmd(methods: str = typer.Option(..., help="comma-separated method names"), config: str = ConfigOpt,
              set_: list[str] = SetOpt, out: Path = typer.Option(None, "--out", "-o", help="sweep directory"),
              seeds: str = typer.Option(None, help="comma-separated training seeds, e.g. 0,1,2: every method is "
                                                   "trained once per seed (runs <out>/<method>-s<seed>) and the "
                                                   "table shows mean ± std (default: train.seed alone)"),
              jobs: int = typer.Option(1, "--jobs", "-j", min=0, help="runs at once, each in its own process "
                                       "(one GPU each via CUDA_VISIBLE_DEVICES; logs in <run>/sweep.log); "
                                       "0 = one per visible GPU"),
              force: bool = typer.Option(False, help="train and evaluate again the runs that are already done"),
              progress: Optional[bool] = ProgressOpt):
    """Train and evaluate several methods on equal terms; print the table, draw the plots.

    Every method gets the same data, seed, token budget and evaluation windows; a finished run is
    not trained again and a partial one resumes. Writes results.json, results.md and the figures.
    """
    from ..config import load_config
    from ..fileio import check_writable_dir
    from ..report.eval_tables import eval_table
    from ..report.tables import show
    from ..training.loop import TrainingDiverged
    from ..training.sweep import SweepError, sweep

    try:
        names = _parse_methods(methods)
        seed_list = _parse_seeds(seeds)
        cfg = load_config(config, set_ or [])  # sweep() checks every run's config before the first trains
        check_writable_dir(out or Path("runs") / f"sweep-{cfg.data.corpus}-T{cfg.train.seq_len}",
                           "--out" if out else "the sweep folder")
        out = out or Path("runs") / f"sweep-{cfg.data.corpus}-T{cfg.train.seq_len}"
        result = sweep(names, cfg, out, progress=_progress(progress), jobs=jobs, force=force, seeds=seed_list)
    except _user_errors(TrainingDiverged, SweepError) as e:
        _fail(e)
    show([eval_table(result["results"])])
    print("figures: " + ", ".join(result["figures"]))


@_command("compare")
def compare_cmd(runs: list[Path] = typer.Argument(..., metavar="RUN_OR_FOLDER", show_default=False,
                                                  help="run folders, or folders of runs (each subfolder with an "
                                                       "eval.json, e.g. a sweep's --out)"),
                reference: str = typer.Option(None, help="a method to compare every other one with (paired "
                                                         "differences of perplexity)"),
                out: Path = typer.Option(None, "--out", "-o", show_default=False,
                                         help="the JSON file to write (default compare.json); a file that lenx "
                                              "compare did not write is never overwritten"),
                resamples: int = typer.Option(2000, help="bootstrap resamples of documents (at least 100)"),
                seed: int = typer.Option(0, help="seed of the bootstrap resamples"),
                force: bool = typer.Option(False, help="replace the compare.json of an earlier comparison (the "
                                                       "default --out); a named --out of one is replaced anyway")):
    """Compare methods over seeds: perplexity with intervals over seeds and documents.

    Reads each run's eval.json (`lenx eval` writes it, with one NLL per window), groups the runs by
    method (each run one training seed) and prints per method and length the mean perplexity over
    seeds with its 95% percentile bootstrap interval (documents resampled, one draw for all).

    With --reference, the paired difference of every other method to it, with an interval over both
    the documents and each method's seeds (marked † where a method has one seed: documents only),
    and the verdicts that a single document decides.

    All runs must be
    evaluated on the same windows (corpus, split, eval.seed, windows, scored and lengths). Writes
    the numbers to --out as JSON (compare.json: an earlier one there is replaced only with --force).
    """
    from ..report.compare import MIN_RESAMPLES, CompareError, compare_to_file
    from ..report.compare_tables import compare_report, unfinished_runs
    from ..report.tables import show

    named, out = out is not None, out or Path("compare.json")
    try:
        if resamples < MIN_RESAMPLES:
            raise CompareError(f"--resamples must be at least {MIN_RESAMPLES}, got {resamples}")
        if seed < 0:
            raise CompareError(f"--seed must be an integer >= 0, got {seed}")
        result = compare_to_file(runs, out, named, force, reference, n=resamples, seed=seed)
    except CompareError as e:
        _fail(e)
    for line in unfinished_runs(result):
        print(line, file=sys.stderr)
    show(compare_report(result))
    print(f"wrote {out}")


@_command("plot")
def plot_cmd(source: Path = typer.Argument(..., help="a folder (every figure under it is re-drawn from its JSON), a "
                                           "results.json / eval.json / che.json / attention JSON file, or a run "
                                           "directory with --attention"),
             out: Path = typer.Option(None, "--out", "-o", help="output folder (default: next to each JSON file)"),
             attention: bool = typer.Option(False, help="draw attention maps (scores, bias, processed) of one run, "
                                                        "and save them as JSON next to the figure"),
             length: int = typer.Option(64, help="input length for --attention"),
             layer: int = typer.Option(0, help="--attention: the layer, from 0"),
             head: int = typer.Option(0, help="--attention: the head, from 0")):
    """Re-draw the figures from saved JSON, or draw the attention maps of a run.

    With --attention the maps of one input are computed from the run's checkpoint (on the CPU),
    saved as JSON and drawn from that file.
    """
    from ..report import plot
    from ..fileio import OutputError, check_writable_dir

    try:
        if out is not None:
            check_writable_dir(out, "--out")
        if attention:
            from ..evaluation.attention_maps import save_run_attention

            saved, png = save_run_attention(source, out, layer=layer, head=head, length=length)
            print(saved)
            print(plot.draw_attention_maps(plot.load_attention_maps(saved), png))
            return
        if out is None and source.exists():  # the figures go next to their JSON
            check_writable_dir(source if source.is_dir() else source.parent, "the figures' folder")
        for path in plot.redraw(source, out):
            print(path)
    except (*_user_errors(), plot.PlotError) as e:
        _fail(e)
    except OSError as e:  # a figure's own path taken (e.g. by a folder): one line, not a traceback
        _fail(OutputError(f"cannot write a figure: {e}"))


@_command("che")
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
            progress: Optional[bool] = ProgressOpt):
    """Run the Chomsky-hierarchy length-generalisation benchmark (CHE).

    Each task is trained on lengths 1..40 and tested on 41..500. `lenx list` names the tasks with
    their Chomsky level and chance accuracy.
    """
    from ..che.protocol import CHEError, make_config, merge_che, run_che
    from ..tasks import UnknownTaskError

    from ..fileio import check_writable_dir

    split = lambda text: [x for x in text.split(",") if x] if text else None  # noqa: E731
    try:
        check_writable_dir(out, "--out")
        if merge:
            result = merge_che([Path(p) for p in split(merge)], out)
        else:
            cfg = make_config(preset, tasks=split(tasks), methods=split(methods), steps=steps,
                              seeds=_parse_seeds(seeds), test_max_length=test_max_length,
                              test_length_step=test_length_step, test_samples=test_samples)
            result = run_che(cfg, out, progress=_progress(progress))
    except (*_user_errors(), UnknownTaskError, CHEError) as e:
        _fail(e)
    print((out / "che.md").read_text())
    print(f"wrote {out / 'che.json'}, {out / 'che_per_length.png'}")
    return result


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


@_command()
def demo(out: Path = typer.Option(Path("runs/demo"), "--out", "-o"),
         steps: int = typer.Option(300, help="training steps per method"),
         progress: Optional[bool] = ProgressOpt):
    """Compare rope, kerple and dapev2-kerple on the synthetic corpus (CPU, minutes).

    The main job: each method trains at length 64 and is evaluated up to 8x that; the table and the
    plot paths are printed.
    """
    from ..config import load_config
    from ..report.eval_tables import eval_table
    from ..report.tables import show
    from ..training.loop import TrainingDiverged
    from ..training.sweep import SweepError, sweep

    try:
        cfg = load_config("tiny", [f"train.steps={steps}"])
        result = sweep(["rope", "kerple", "dapev2-kerple"], cfg, out, progress=_progress(progress))
    except _user_errors(TrainingDiverged, SweepError) as e:
        _fail(e)
    show([eval_table(result["results"])])
    print(f"table: {out / 'results.md'}")
    print("figures: " + ", ".join(result["figures"]))


def main(argv: list[str] | None = None) -> int:
    """The `lenx` command. Typer's own usage errors (a missing argument, a value of the wrong type,
    an unknown option or command) are one line as well, like every other user error."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        code = app(args or ["--help"], prog_name="lenx", standalone_mode=False)
    except Exception as e:  # click's exceptions, which typer may vendor: matched by name
        kinds = {c.__name__ for c in type(e).__mro__}
        if "UsageError" in kinds:
            sys.stderr.write(f"error: {e.format_message()}\n")
            return 2
        if "Abort" in kinds:  # Ctrl-C outside the training loop
            sys.stderr.write("aborted\n")
            return 130
        raise
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
