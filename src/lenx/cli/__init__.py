"""The `lenx` command: a thin layer over the library functions.

Every command checks all of its input before it starts any work, and reports a user error as one
line on stderr with exit code 2. This module holds the typer app, main() and what the commands
share (registration, one-line errors, progress, the parsers of list options); each group of
commands is a module of its own that registers them when imported: data (list, prepare), shard, train,
evaluate (eval, generate), export, sweep, report (compare, plot), che, bench and demo.

Imports: anything of lenx, inside the commands' functions only, so `lenx --help` loads no torch;
the trainer (lenx.training.loop and sweep) only in the train, sweep and demo commands. The
commands build no tables: lenx.report does.
"""

import inspect
import os
from pathlib import Path
import sys

import typer



class _Conventional:
    """Help in the usual notation, whatever typer's version: arguments in capitals on the usage line
    (`lenx eval [OPTIONS] [RUN]`, `lenx prepare [OPTIONS] CORPUS`; typer writes `[run]`, `{corpus}`),
    and no type beside a flag (typer writes `--help <bool>`)."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if param.param_type_name == "argument" and param.metavar is None:
                param.metavar = param.name.upper()
            elif getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""  # what typer shows as the flag's type
        return params

    def collect_usage_pieces(self, ctx):
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = param.metavar + ("..." if param.nargs != 1 else "")
                pieces.append(name if param.required else f"[{name}]")
        if isinstance(self, typer.core.TyperGroup):
            pieces.append(self.subcommand_metavar)
        return pieces


class _Command(_Conventional, typer.core.TyperCommand):
    pass


class _Group(_Conventional, typer.core.TyperGroup):
    pass


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, cls=_Group,
                  help="lenx: train on short sequences, evaluate at long ones, compare attention variants.")


def _version(value: bool):
    if value:
        from .. import __version__

        print(f"lenx {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                          help="print lenx's version and exit")):
    pass


ConfigOpt = typer.Option("tiny", "--config", "-c", help="a TOML file or a preset name (tiny, small, 125m, 350m); "
                         "tiny (for a CPU) trains on the token-level synthetic corpus: for text, add "
                         "--set data.corpus=NAME, a corpus made with `lenx prepare NAME`")
SetOpt = typer.Option(None, "--set", "-s", help="dotted override, repeatable: --set model.method=kerple")
ProgressOpt = typer.Option(None, "--progress/--no-progress",
                           help="progress bars (default: only when stderr is a terminal, so a piped log gets none)")
NoMemoryCheckOpt = typer.Option(False, "--no-memory-check",
                                help="train even when the estimate of a step's peak memory exceeds what the device "
                                     "has available (by default such a run is refused before it starts)")


def _command(name: str | None = None):
    """app.command with the docstring's paragraphs reflowed. Typer keeps the line breaks of every
    paragraph but the first, which then show as lines broken mid-sentence at any terminal width."""
    def register(fn):
        paragraphs = inspect.cleandoc(fn.__doc__).split("\n\n")
        return app.command(name, cls=_Command, help="\n\n".join(" ".join(p.split()) for p in paragraphs))(fn)

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


def main(argv: list[str] | None = None) -> int:
    """The `lenx` command. Typer's own usage errors (a missing argument, a value of the wrong type,
    an unknown option or command) are one line as well, like every other user error."""
    args = sys.argv[1:] if argv is None else list(argv)
    if any(name.startswith("LENX_DAPE_V2_") for name in os.environ):
        from ..attention.backends.fused import check_settings

        try:
            check_settings()
        except ValueError as e:
            sys.stderr.write(f"error: {e}\n")
            return 2
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


# The commands: importing each group registers it with `app`, in the order `lenx --help` lists them.
from . import data, shard, train, evaluate, export, sweep, report, che, bench, demo  # noqa: E402, F401
