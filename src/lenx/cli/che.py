"""`lenx che`: the Chomsky-hierarchy length-generalisation benchmark."""

from pathlib import Path
import re
from typing import Optional

import typer

from . import NoMemoryCheckOpt, ProgressOpt, _command, _fail, _parse_seeds, _progress, _user_errors


@_command("che")
def che_cmd(tasks: str = typer.Option(None, help="comma-separated task names (default: all 15)"),
            methods: str = typer.Option(None, help="comma-separated methods (default: rope,alibi,kerple,dape-kerple,"
                                        "dapev2-kerple); a layout (model.layers) is a preset or in parentheses: "
                                        "(3*(rope:w16),nope)"),
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
            force: bool = typer.Option(False, "--force", help="run a test of more than 10 times the paper's work "
                                                               "(longer or more test lengths or samples), which "
                                                               "is refused by default"),
            progress: Optional[bool] = ProgressOpt, no_memory_check: bool = NoMemoryCheckOpt):
    """Run the Chomsky-hierarchy length-generalisation benchmark (CHE).

    Each task is trained on lengths 1..40 and tested on 41..500. `lenx list` names the tasks with
    their Chomsky level and chance accuracy. A method whose training or test would not fit the
    device's memory is refused before anything trains (--no-memory-check runs it anyway), and so is
    a test of more than 10 times the paper's work, which could take hours (--force runs it anyway).
    """
    from ..che.protocol import CHEError, make_config, merge_che, run_che
    from ..fileio import check_writable_dir
    from ..tasks import UnknownTaskError

    split = lambda text: [x for x in text.split(",") if x] if text else None  # noqa: E731
    try:
        check_writable_dir(out, "--out")
        if merge:
            result = merge_che([Path(p) for p in split(merge)], out)
        else:
            # a comma inside parentheses is a layout's
            methods_ = [m for m in re.split(r",(?![^()]*\))", methods) if m] if methods else None
            cfg = make_config(preset, tasks=split(tasks), methods=methods_, steps=steps,
                              seeds=_parse_seeds(seeds), test_max_length=test_max_length,
                              test_length_step=test_length_step, test_samples=test_samples)
            result = run_che(cfg, out, progress=_progress(progress), memory_check=not no_memory_check, force=force)
    except (*_user_errors(), UnknownTaskError, CHEError) as e:
        _fail(e)
    print((out / "che.md").read_text())
    print(f"wrote {out / 'che.json'}, {out / 'che_per_length.png'}")
    return result
