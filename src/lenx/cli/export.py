"""`lenx export` (a trained run as a transformers model folder)."""

from pathlib import Path
import sys

import typer

from . import _command, _fail, _user_errors


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
