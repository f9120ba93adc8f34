"""`lenx export` (a trained run as a transformers model folder)."""

from pathlib import Path

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
    modeling_lenx.py, which run the installed lenx's model), the corpus's tokenizer and a README.md.

    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True) then gives the run's logits, and
    its generate() decodes with lenx's KV cache. The folder is checked to do so before it is moved
    into place. Needs transformers (lenx's hf extra).
    """
    from ..export.folder import ExportError, export_run

    try:
        result = export_run(run, out, step, force)
    except _user_errors(ExportError) as e:
        _fail(e)
    tokenizer = "its tokenizer" if result["tokenizer"] else "no tokenizer (a token-level corpus)"
    print(f"wrote {result['folder']}: {result['method']}, step {result['step']}, {result['parameters']:,} parameters, "
          f"{tokenizer} ({', '.join(result['files'])})")
