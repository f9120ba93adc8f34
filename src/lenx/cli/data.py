"""`lenx list` (every method with its backends, every CHE task) and `lenx prepare` (build a corpus)."""

from pathlib import Path
from typing import Optional

import typer

from . import ProgressOpt, _command, _fail, _progress, _user_errors


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
def prepare(corpus: str = typer.Argument(..., help="tech, books, code, synthetic, or a new name with --from"),
            from_path: Path = typer.Option(None, "--from", help="a folder of text files or a JSONL file with a 'text' field"),
            root: Path = typer.Option(Path("data"), help="where corpora live"),
            tokenizer: str = typer.Option("bpe", help="bpe (trained on the train split) or gpt2"),
            vocab_size: int = typer.Option(16384, help="BPE vocabulary size"),
            seed: int = typer.Option(0),
            long_test: Optional[int] = typer.Option(None, "--long-test", show_default=False,
                                                    help="reserve this many documents of at least --long-test-tokens "
                                                    "tokens for the test split, so evaluation windows at long lengths "
                                                    "can each come from a document of their own (default: 300 for "
                                                    "code, else 0)"),
            long_test_tokens: Optional[int] = typer.Option(None, "--long-test-tokens", show_default=False,
                                                           help="the size in tokens of a document that --long-test "
                                                           "reserves (default: 16385 for code, else 16384)"),
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
            keep_non_text: bool = typer.Option(False, "--keep-non-text",
                                               help="keep the documents that are not text (NUL padding, base64 or "
                                                    "hex data, one-line data dumps), which are dropped otherwise: "
                                                    "builds a corpus as lenx did before it dropped them"),
            progress: Optional[bool] = ProgressOpt):
    """Build a corpus: fetch, extract, dedupe, split by document, tokenize, pack.

    `code` (the Linux kernel's source tree with tech's and books' text) also drops near-duplicate
    documents (MinHash LSH, with the datasketch package of lenx's `dedup` extra) and reserves 300
    documents of >= 16385 tokens for its test split.

    Prints the manifest (without its sources) as JSON on stdout, and one line per split (documents,
    tokens, documents of >= 8192 and >= 16384 tokens) on stderr, then how many non-text (and
    near-duplicate) documents were dropped.
    """
    from ..data.build import prepare_corpus
    from ..data.build.neardup import summary_line as near_dup_line
    from ..data.build.nontext import summary_line
    from ..fileio import check_writable_dir
    from ..report.corpus_summary import manifest_json, skipped_records, split_summary

    try:
        check_writable_dir(root, "--root")
        check_writable_dir(root / corpus, "the corpus folder")
        manifest = prepare_corpus(corpus, root, from_path=from_path, tokenizer=tokenizer, vocab_size=vocab_size,
                                  seed=seed, force=force, allow_missing_sources=allow_missing_sources,
                                  long_test=long_test, long_test_tokens=long_test_tokens, progress=_progress(progress),
                                  skip_bad_records=skip_bad_records, keep_non_text=keep_non_text)
    except _user_errors() as e:
        _fail(e)
    print(manifest_json(manifest))
    for line in split_summary(manifest) + skipped_records(manifest):
        typer.echo(line, err=True)
    for line in (summary_line(manifest), near_dup_line(manifest)):
        if line:
            typer.echo(line, err=True)
