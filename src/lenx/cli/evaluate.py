"""`lenx eval` (perplexity at every length, or a retrieval task) and `lenx generate` (continue a
prompt)."""

from pathlib import Path
import sys
from typing import List, Optional

import typer

from . import ProgressOpt, _command, _fail, _parse_ints, _progress, _run_config, _user_errors

# the attention backends --backend takes (lenx.attention.backends.BACKENDS, named here so that --help loads no torch)
BACKEND_CHOICES = "auto, triton, sdpa, flex, chunked or dense"


@_command("eval")
def eval_cmd(run: Path = typer.Argument(None, show_default=False, help="a run directory (or --hf DIR)"),
             hf: Path = typer.Option(None, "--hf", show_default=False,
                                     help="evaluate a local transformers causal LM folder (config.json, weights, "
                                          "tokenizer) instead of a run; nothing is downloaded"),
             corpus: str = typer.Option(None, help="--hf: the prepared corpus to evaluate on"),
             data_root: Path = typer.Option(None, help="--hf: the folder of prepared corpora (default data)"),
             like: Path = typer.Option(None, help="--hf: evaluate on the windows of this lenx run (its corpus, split, "
                                                  "eval seed, windows, scored tokens and lengths), to compare with it"),
             out: Path = typer.Option(None, "--out", "-o", help="--hf: the output folder (default runs/hf/<name>)"),
             name: str = typer.Option(None, help="--hf: the model's name in tables and lenx compare (default: its "
                                                 "folder's name)"),
             train_len: int = typer.Option(None, help="--hf: the model's training length, for ΔP and the default "
                                                      "lengths (default: from its config.json)"),
             lengths: str = typer.Option(None, help="comma-separated, e.g. 128,256,512 (default: powers of two from the training length to eval.max_length)"),
             windows: int = typer.Option(None, help="windows per length (default eval.windows)"),
             scored: int = typer.Option(None, help="score the last N tokens (default eval.scored, 256)"),
             device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N"),
             backend: str = typer.Option(None, help=f"force an attention backend: {BACKEND_CHOICES}"),
             step: int = typer.Option(None, help="evaluate the weights kept at this step (train.keep_every) "
                                                 "instead of the last checkpoint"),
             rope_scaling: str = typer.Option(None, help="evaluate a RoPE model with a context extension: pi, ntk, "
                                                         "dynamic-ntk or yarn (writes eval_rope-<scaling>.json)"),
             rope_scaling_factor: str = typer.Option(None, help="the scale s of --rope-scaling: auto (evaluation "
                                                                "length / training length, the default) or a number "
                                                                ">= 1; not with dynamic-ntk, which sets its own"),
             task: str = typer.Option(None, help="a retrieval task instead of perplexity: passkey, copy, ruler, babilong "
                                                 "or a comma list of suite tasks (writes eval_<task>.json)"),
             depths: str = typer.Option(None, help="--task: comma-separated depths in [0, 1] (default 0,0.25,0.5,0.75,1)"),
             samples: int = typer.Option(None, help="--task: inputs per length and depth (default 8)"),
             per_position: Optional[bool] = typer.Option(
                 None, "--per-position/--no-per-position", show_default=False,
                 help="also the mean NLL per token position of the longest windows, in log-spaced bins, from the "
                      "same forward passes (eval.json's per_position; default: the run's eval.per_position)"),
             progress: Optional[bool] = ProgressOpt):
    """Evaluate a run: perplexity at every length, ΔP and full-sequence perplexity.

    The perplexity of the last --scored tokens of the same windows at every length (the DAPE V2
    paper's protocol); writes eval.json into the run directory, keeping an earlier evaluation there
    with other settings beside it as eval.<key>.json. The run's corpus must be the one it was trained on.

    With --task, a task over lengths x depths instead: passkey or copy at distance, or the synthetic
    suite (ruler, babilong, or a list such as niah_single,vt,qa1; docs/suite.md).

    With --hf DIR instead of a run, the same protocol on a local transformers causal LM, with the RoPE
    scaling of its own config: the windows of --corpus (or of the run given by --like) read as text in
    the model's tokens, with bits per byte beside perplexity; results go to --out for lenx compare and
    lenx plot.
    """
    if hf is not None:
        return _eval_hf(hf, run, corpus, data_root, like, out, name, train_len, lengths, windows, scored, device,
                        backend, step, rope_scaling, rope_scaling_factor, task, depths, samples, progress,
                        bool(per_position))
    from ..config import ConfigError, validate
    from ..evaluation.evaluate import evaluate, evaluate_task, result_name
    from ..fileio import check_writable_dir, check_writable_file
    from ..model import check_device
    from ..report.eval_tables import eval_table
    from ..report.suite_tables import any_task_table
    from ..report.tables import show

    try:
        if run is None:
            raise ConfigError("give a run directory to evaluate (lenx eval RUN), or a transformers model folder "
                              "with --hf DIR")
        given = [f"--{key.replace('_', '-')}" for key, value in (("corpus", corpus), ("data_root", data_root),
                 ("like", like), ("out", out), ("name", name), ("train_len", train_len)) if value is not None]
        if given:
            raise ConfigError(f"{', '.join(given)} {'belongs' if len(given) == 1 else 'belong'} to --hf; "
                              f"a run is evaluated on its own corpus, into its own folder")
        cfg = _run_config(run)
        # before any work: an evaluation that cannot be saved is not started
        check_writable_dir(run, "the run folder")
        check_writable_file(Path(run) / result_name(step, rope_scaling, task), "the evaluation file")
        if backend:
            from ..model import with_backend

            cfg = with_backend(cfg, backend, device)
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
            _perplexity_only(windows=windows, scored=scored, per_position=per_position)
            result = evaluate_task(run, task, _parse_ints(lengths, "--lengths"), _parse_floats(depths, "--depths"),
                                   samples, device, backend, step, rope_scaling, factor, progress=_progress(progress))
        else:
            if depths is not None or samples is not None:
                raise ConfigError("--depths and --samples belong to --task")
            result = evaluate(run, _parse_ints(lengths, "--lengths"), windows, scored, device, backend,
                              progress=_progress(progress), step=step, rope_scaling=rope_scaling,
                              rope_scaling_factor=factor, per_position=per_position)
    except _user_errors() as e:
        _fail(e)
    show([any_task_table(result) if task is not None else eval_table([result])])
    _positions_line(result)
    print(f"wrote {Path(run) / result_name(step, rope_scaling, task and result['task'])}")


def _eval_hf(hf, run, corpus, data_root, like, out, name, train_len, lengths, windows, scored, device, backend, step,
             rope_scaling, rope_scaling_factor, task, depths, samples, progress, per_position=False):
    """`lenx eval --hf DIR`: every option checked (and the folder, the corpus and the windows) before
    the weights are loaded."""
    from ..config import ConfigError, resolve_device
    from ..report.eval_tables import hf_table
    from ..report.suite_tables import any_task_table
    from ..report.tables import show

    try:
        wrong = {"RUN": run, "--backend": backend, "--step": step, "--rope-scaling": rope_scaling,
                 "--rope-scaling-factor": rope_scaling_factor}
        wrong = [key for key, value in wrong.items() if value is not None]
        if "--rope-scaling" in wrong or "--rope-scaling-factor" in wrong:
            raise ConfigError("--rope-scaling is lenx's context extension of its own runs; with --hf the model's own "
                              "config.json sets its RoPE scaling (set rope_scaling there)")
        if wrong:
            raise ConfigError(f"{', '.join(wrong)} {'applies' if len(wrong) == 1 else 'apply'} to lenx runs, not to --hf")
        resolve_device(device, "--device")
        options = dict(corpus=corpus, data_root=data_root, like=like, out=out, name=name,
                       lengths=_parse_ints(lengths, "--lengths"), train_len=train_len, device=device,
                       progress=_progress(progress))
        if task is not None:
            _perplexity_only(windows=windows, scored=scored, per_position=per_position or None)
            from ..evaluation.hf_eval import evaluate_hf_task

            result = evaluate_hf_task(hf, task, depths=_parse_floats(depths, "--depths"), samples=samples, **options)
        else:
            if depths is not None or samples is not None:
                raise ConfigError("--depths and --samples belong to --task")
            from ..evaluation.hf_eval import evaluate_hf

            result = evaluate_hf(hf, windows=windows, scored=scored, per_position=per_position, **options)
    except _user_errors() as e:
        _fail(e)
    show([any_task_table(result) if task is not None else hf_table(result)])
    _positions_line(result)
    written = f"eval_{result['task']}.json" if task else "eval.json"
    print(f"wrote {Path(result['run']) / written}")


@_command("generate")
def generate_cmd(run: Path = typer.Argument(..., help="a run directory"),
                 prompt: Optional[List[str]] = typer.Option(None, help="a text to continue (token ids separated by "
                                                                      "spaces for the token-level synthetic corpus); "
                                                                      "repeat it for several, decoded as one batch"),
                 prompt_from_file: Path = typer.Option(None, help="read ONE prompt from this file: all of it, line "
                                                                  "breaks included"),
                 prompts_file: Path = typer.Option(None, help="read SEVERAL prompts from this file, one per line "
                                                              "(blank lines skipped), decoded as one batch"),
                 old_prompt_file: Path = typer.Option(None, "--prompt-file", hidden=True),
                 max_new_tokens: int = typer.Option(100, help="tokens to generate"),
                 temperature: float = typer.Option(1.0, help="0 is greedy (deterministic)"),
                 top_k: int = typer.Option(0, help="sample among the k most likely tokens (0: all)"),
                 top_p: float = typer.Option(1.0, help="sample among the most likely tokens up to this probability"),
                 seed: int = typer.Option(0, help="seed of the sampling"),
                 stop: Optional[List[str]] = typer.Option(None, help="a text that ends a continuation, left out of "
                                                                    "it (token ids separated by spaces on a "
                                                                    "token-level corpus); repeatable"),
                 stop_id: Optional[List[int]] = typer.Option(None, help="a token id that ends a continuation; "
                                                                       "repeatable"),
                 max_context: int = typer.Option(32768, help="the cache limit: the longest prompt plus new tokens"),
                 device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N"),
                 backend: str = typer.Option(None, help=f"force the attention backend of the prompts' forward: "
                                                        f"{BACKEND_CHOICES}"),
                 cuda_graph: Optional[bool] = typer.Option(None, "--cuda-graph/--no-cuda-graph",
                                                           help="decode each token as one CUDA graph (default: on "
                                                                "CUDA)"),
                 json_out: bool = typer.Option(False, "--json", help="print the result as JSON on stdout instead "
                                                                     "of the text (each output with its prompt)"),
                 no_memory_check: bool = typer.Option(False, "--no-memory-check",
                                                      help="generate even when the estimate of the KV cache and "
                                                           "the prompts' forward exceeds the memory available"),
                 progress: Optional[bool] = ProgressOpt):
    """Continue prompts with a trained run, token by token with a KV cache.

    Each prompt is read with the run's attention backends; each new token then costs one row of
    attention per layer against the cached keys and values.

    Several prompts (--prompt repeated, or --prompts-file with one per line) are decoded as one
    left-padded batch, each at its own positions, so greedy decoding continues each as it would
    alone; each continuation ends at --max-new-tokens or at a --stop / --stop-id.
    --prompt-from-file reads a whole file as one prompt.

    One prompt's text is streamed; several are printed when all have ended. The last line (on
    stderr) gives the prefill's and the decoding's rates. Every option, and the memory the cache
    will take, is checked before the model is loaded.
    """
    import json

    from ..config import ConfigError
    from ..fileio import OutputError
    from ..model.generate import check_settings, generate_from_run

    def write(text: str) -> None:  # stdout that cannot be written (a full disk): one line, not a traceback
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except OSError as e:
            _drop_stdout()
            raise OutputError(f"cannot write the output to stdout: {e.strerror or e}") from None

    try:
        if old_prompt_file is not None:
            raise ConfigError("--prompt-file is now --prompt-from-file (the whole file is one prompt); for one "
                              "prompt per line use --prompts-file")
        given = [name for name, value in (("--prompt", prompt), ("--prompt-from-file", prompt_from_file),
                                          ("--prompts-file", prompts_file)) if value]
        if len(given) != 1:
            raise ConfigError("give the prompt with --prompt TEXT (repeatable), --prompt-from-file FILE (one prompt) "
                              "or --prompts-file FILE (one per line): one of them"
                              f"{'; got ' + ', '.join(given) if given else ''}")
        check_settings(max_new_tokens, temperature, top_k, top_p)  # before the run is even read
        if prompt_from_file is not None:
            prompts = _read_text(prompt_from_file, "--prompt-from-file")
        elif prompts_file is not None:
            prompts = [line for line in _read_text(prompts_file, "--prompts-file").splitlines() if line.strip()]
            if not prompts:
                raise ConfigError(f"--prompts-file {prompts_file} has no prompt (every line is blank)")
        else:
            prompts = prompt[0] if len(prompt) == 1 else list(prompt)
        stream = isinstance(prompts, str) and not json_out
        out = generate_from_run(run, prompts, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                seed=seed, device=device, backend=backend, max_context=max_context,
                                write=write if stream else None,
                                note=lambda text: print(text, file=sys.stderr, flush=True),
                                progress=_progress(progress), stop=stop or (), stop_ids=stop_id or (),
                                cuda_graph=cuda_graph, memory_check=not no_memory_check)
        if json_out:
            write(json.dumps(out, indent=1) + "\n")
        elif stream:
            write("\n")
        else:
            for i, o in enumerate(out["outputs"], 1):
                ended = f"stop {o['stop']!r}" if o["stop"] is not None else "length"
                write(f"=== {i}/{len(out['outputs'])}: {o['prompt_tokens']} prompt tokens, {len(o['new_tokens'])} "
                      f"new, ended at {ended}\n{o['text']}\n")
    except _user_errors() as e:
        _fail(e)
    outs = out["outputs"]
    new = sum(len(o["new_tokens"]) for o in outs)
    decode = "no decode step" if out["tokens_per_s"] is None else (
        f"decode {out['tokens_per_s']:.1f} tokens/s per sequence ({out['ms_per_token']:.2f} ms/token, "
        f"{out['decoding']})")
    print(f"{new} tokens after {len(outs)} prompt(s) of {sum(o['prompt_tokens'] for o in outs)} tokens: prefill "
          f"{out['prefill_tokens_per_s']:,.0f} tokens/s ({out['prefill_s']:.2f} s), {decode} "
          f"({out['method']}, {out['device']})", file=sys.stderr)


def _read_text(path: Path, option: str) -> str:
    """A prompt file's text: a one-line error when it is missing, unreadable or not UTF-8."""
    from ..config import ConfigError

    if not path.is_file():
        raise ConfigError(f"{option} {path} is not a file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {option} {path}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{option} {path} is not UTF-8 (byte 0x{data[e.start]:02x} at {e.start})") from None


def _drop_stdout() -> None:
    """Send what stdout still buffers to /dev/null, so that the exit does not fail on it again."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _positions_line(result: dict) -> None:
    """One line on the per-position loss, where the evaluation has it (the bins are in the JSON)."""
    pp = result.get("per_position")
    if pp:
        print(f"per-position NLL: {len(pp['nll'])} bins of positions 0-{pp['from_length'] - 1} ({pp['unit']}), "
              f"{pp['nll'][0]:.3f} in the first, {pp['nll'][-1]:.3f} in the last; `lenx plot` draws them")


def _perplexity_only(windows, scored, per_position) -> None:
    """The options of the perplexity evaluation, refused with --task."""
    from ..config import ConfigError

    if windows is not None or scored is not None:
        raise ConfigError("--windows and --scored belong to the perplexity evaluation, not to --task")
    if per_position is not None:
        raise ConfigError("--per-position belongs to the perplexity evaluation, not to --task")


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
