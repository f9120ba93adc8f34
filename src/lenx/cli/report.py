"""`lenx compare` (methods over seeds and documents) and `lenx plot` (figures from saved JSON, or the
attention maps of a run)."""

from pathlib import Path
import sys

import typer

from . import _command, _fail, _user_errors


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
    seeds and its ΔP, each with a 95% interval over the documents (one bootstrap draw for all) and the
    seeds (marked † where a method has one seed: documents only).

    With --reference, the paired difference of every other method to it, with the same interval,
    and the verdicts that a single document decides.

    Each method's effective length: the longest length up to which its perplexity stays within
    0.85 of its own at the training length (ppl(L) <= ppl(T_train) / 0.85), and per task of the
    suite files (eval_<tasks>.json) its runs have, with a range from the intervals.

    Runs evaluated with --per-position get their loss-by-position curves, with intervals per bin, in
    the JSON and in <out>_per_position.png.

    All runs must be
    evaluated on the same windows (corpus, split, eval.seed, windows, scored and lengths). Writes
    the numbers to --out as JSON (compare.json: an earlier one there is replaced only with --force;
    without it the table is printed and the earlier file kept, exit code 2).
    """
    from ..report.compare import MIN_RESAMPLES, CompareError, compare_to_file
    from ..report.compare_tables import compare_report, unfinished_runs
    from ..report.positions import draw_compare
    from ..report.tables import show

    named, out = out is not None, out or Path("compare.json")
    try:
        if resamples < MIN_RESAMPLES:
            raise CompareError(f"--resamples must be at least {MIN_RESAMPLES}, got {resamples}")
        if seed < 0:
            raise CompareError(f"--seed must be an integer >= 0, got {seed}")
        def shown(result):  # the table, also when an earlier compare.json then refuses to be replaced
            for line in unfinished_runs(result):
                print(line, file=sys.stderr)
            show(compare_report(result))

        result = compare_to_file(runs, out, named, force, reference, n=resamples, seed=seed, show=shown)
        figure = draw_compare(result, out.with_name(f"{out.stem}_per_position.png"))  # where runs have per_position
    except CompareError as e:
        _fail(e)
    print(f"wrote {out}" + (f" and {figure}" if figure else ""))


@_command("plot")
def plot_cmd(source: Path = typer.Argument(..., help="a folder (every figure under it is re-drawn from its JSON), a "
                                           "results.json / eval.json / che.json / attention JSON file, or a run "
                                           "directory with --attention"),
             out: Path = typer.Option(None, "--out", "-o", help="output folder (default: next to each JSON file)"),
             attention: bool = typer.Option(False, help="draw attention maps (scores, bias, processed) of one run, "
                                                        "and save them as JSON next to the figure"),
             length: int = typer.Option(64, help="input length for --attention"),
             layer: int = typer.Option(0, help="--attention: the layer, from 0"),
             head: int = typer.Option(0, help="--attention: the head, from 0"),
             force: bool = typer.Option(False, "--force", help="--attention: write the maps even when their JSON "
                                                                "would exceed 100 MB (it grows as --length^2)")):
    """Re-draw the figures from saved JSON, or draw the attention maps of a run.

    With --attention the maps of one input are computed from the run's checkpoint (on the CPU),
    saved as JSON and drawn from that file. A --length whose JSON would exceed 100 MB (about 3000
    tokens for one map) is refused unless --force is given.
    """
    from ..fileio import OutputError, check_writable_dir
    from ..report import plot

    try:
        if out is not None:
            check_writable_dir(out, "--out")
        if attention:
            from ..evaluation.attention_maps import save_run_attention

            saved, png = save_run_attention(source, out, layer=layer, head=head, length=length, force=force)
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
