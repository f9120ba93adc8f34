"""`lenx export` (a trained run as a transformers model folder)."""

from pathlib import Path
import sys

import typer

from . import _command, _fail, _parse_ints, _user_errors


@_command("export")
def export_cmd(run: Path = typer.Argument(..., help="a run directory"),
               out: Path = typer.Argument(..., metavar="DIR", show_default=False,
                                          help="the folder to write: a new or empty one (an earlier export with --force)"),
               step: int = typer.Option(None, help="export the weights kept at this step (train.keep_every) instead "
                                                   "of the last checkpoint"),
               force: bool = typer.Option(False, help="replace an earlier `lenx export` in DIR")):
    """Write a trained run as a folder that transformers loads, with lm-evaluation-harness on top.

    DIR gets config.json, model.safetensors, the model's code (configuration_lenx.py and
    modeling_lenx.py, which run the installed lenx's model), the corpus's tokenizer (EOS pads), a
    small lm-eval task that runs offline (lm_eval_tasks/) and a README.md. A run that has not
    finished training is exported with a note (step N of M, also recorded in the folder).

    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True) then gives the run's logits, and
    its generate() decodes with lenx's KV cache. The folder is checked to do so before it is moved
    into place. Needs transformers (lenx's hf extra).
    """
    from ..export.folder import ExportError, export_run

    try:
        result = export_run(run, out, step, force)
    except _user_errors(ExportError) as e:
        _fail(e)
    if not result["finished"]:
        print(f"note: {run} has not finished training: exported the weights of step {result['step']} of "
              f"{result['steps']} (recorded in {result['folder']}/config.json and README.md)", file=sys.stderr)
    tokenizer = "its tokenizer" if result["tokenizer"] else "no tokenizer (a token-level corpus)"
    print(f"wrote {result['folder']}: {result['method']}, step {result['step']}, {result['parameters']:,} parameters, "
          f"{tokenizer} ({', '.join(result['files'])})")


@_command("suite-export")
def suite_export_cmd(out: Path = typer.Argument(..., metavar="DIR", show_default=False,
                                                help="the task folder to write: a new or empty one (an earlier "
                                                     "suite-export with --force)"),
                     task: str = typer.Option(..., help="ruler, babilong or a comma list of suite tasks"),
                     like: Path = typer.Option(None, help="the instances `lenx eval LIKE --task` scores: this run's "
                                                          "corpus, eval split, eval seed and default lengths"),
                     corpus: str = typer.Option(None, help="instead of --like: a prepared corpus (with --lengths), "
                                                           "the instances of `lenx eval --hf DIR --corpus NAME --task`"),
                     data_root: Path = typer.Option(None, help="--corpus: the folder of prepared corpora (default data)"),
                     lengths: str = typer.Option(None, help="comma-separated input lengths in the corpus's tokens "
                                                            "(default with --like: the run's, as lenx eval)"),
                     depths: str = typer.Option(None, help="comma-separated depths in [0, 1] (default 0,0.25,0.5,0.75,1)"),
                     samples: int = typer.Option(None, help="inputs per length and depth (default 8)"),
                     force: bool = typer.Option(False, help="replace an earlier `lenx suite-export` in DIR")):
    """Write the synthetic suite's instances as lm-evaluation-harness tasks that run offline.

    DIR gets, per suite task T, T.jsonl (the instances as text: the very inputs `lenx eval --task`
    scores), lenx_T.yaml (greedy generation, exact match as lenx scores it) and lenx_T_logprob.yaml
    (the answer's log-likelihood); lenx_suite.py loads and scores them, and lenx_suite.json records
    the corpus fingerprint, the grid and each task's instances hash (as in eval_<task>.json).

    Then: lm_eval --model hf --model_args pretrained=MODEL,max_length=N --include_path DIR --tasks
    lenx_suite (docs/suite.md).
    """
    from ..config import ConfigError
    from ..evaluation.suite_export import export_settings, export_suite
    from ..evaluation.suite_eval import check_grid
    from .evaluate import _parse_floats

    try:
        grid = check_grid(_parse_floats(depths, "--depths"), samples)
        settings = export_settings(like, corpus, data_root, _parse_ints(lengths, "--lengths"))
        manifest = export_suite(out, task, settings, *grid, force=force)
    except _user_errors(ConfigError) as e:
        _fail(e)
    tasks = manifest["tasks"]
    print(f"wrote {out}: {len(tasks)} task(s) x {sum(t['count'] for t in tasks.values()) // len(tasks)} instances "
          f"({', '.join(tasks)}) on corpus {manifest['corpus']!r}, lengths {manifest['lengths']}; "
          f"lm_eval --include_path {out} --tasks lenx_suite")
