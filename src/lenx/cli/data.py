"""`lenx list` (every method with its backends, every CHE task) and `lenx prepare` (build a corpus)."""

from pathlib import Path
from typing import Optional

import typer

from . import ProgressOpt, _command, _fail, _progress, _user_errors


@_command("list")
def list_methods():
    """List every method with the backends that run it, the query temperatures, the layout presets,
    and every CHE task.

    A backend marked "forward only" runs there but has no backward (FlexAttention on the CPU), so it
    can evaluate but not train. Where the fused backend picks its kernel by the work (DAPE V2), the
    CUDA column says how; a run's meta.json records the kernels its layers ran ("kernels").

    The layout presets are values of model.layers (each layer's method and window). CHE tasks (`lenx
    che --tasks`) come with their Chomsky level and chance accuracy.
    """
    from ..report.list_tables import layouts_table, method_backends, methods_table, tasks_table, temperatures_table
    from ..report.tables import show
    from ..tasks import TASKS

    show([methods_table(method_backends()), temperatures_table(), layouts_table(), tasks_table(TASKS)])


@_command()
def prepare(corpus: str = typer.Argument(..., help="tech, books, code, synthetic, or a new name with --from"),
            from_path: str = typer.Option(None, "--from", help="your data: a folder of text files (a document "
                                          "each), a JSONL, parquet or arrow file, a folder of such shards, a folder "
                                          "saved by datasets' save_to_disk, or hf:NAME[:CONFIG] (a dataset in the "
                                          "Hugging Face cache, read offline)"),
            text_field: Optional[str] = typer.Option(None, "--text-field", show_default="text",
                                                     help="--from records: the field (column) holding each "
                                                     "document's text, at the top level of a record (nested "
                                                     "fields such as meta.body are not read: flatten first)"),
            split: Optional[str] = typer.Option(None, "--split", show_default="its only one, or train",
                                                help="--from a dataset with splits (a saved DatasetDict, hf:NAME, "
                                                "a folder of shards with train/ and test/ or train-*.parquet and "
                                                "test-*.parquet): the split to read"),
            root: Path = typer.Option(Path("data"), help="where corpora live"),
            tokenizer: str = typer.Option("bpe", help="bpe (trained on the train split), gpt2, or the path of a "
                                          "tokenizer.json or a transformers tokenizer folder (used as it is)"),
            vocab_size: Optional[int] = typer.Option(None, show_default="16384",
                                                     help="the vocabulary size of the BPE trained here"),
            seed: int = typer.Option(0, help="the seed of the split into train, val and test (and of --long-test's "
                                     "draw; synthetic: of its generator)"),
            long_test: Optional[int] = typer.Option(None, "--long-test", show_default=False,
                                                    help="reserve this many documents of at least --long-test-tokens "
                                                    "tokens for the test split, so evaluation windows at long lengths "
                                                    "can each come from a document of their own (default: 300 for "
                                                    "code, else 0)"),
            long_test_tokens: Optional[int] = typer.Option(None, "--long-test-tokens", show_default=False,
                                                           help="the size in tokens of a document that --long-test "
                                                           "reserves (default: 16385 for code, else 16384)"),
            force: bool = typer.Option(False, help="rebuild even if the corpus is already prepared with these "
                                       "settings (without it, running prepare again reuses the corpus), and "
                                       "replace a corpus of this name prepared with other settings or from a --from "
                                       "input whose files have changed since (without it, that is an error; runs "
                                       "trained on the old corpus refuse the new one)"),
            allow_missing_sources: bool = typer.Option(False, help="build the corpus from the sources that could be "
                                                       "fetched when some cannot (the manifest lists the missing ones)"),
            skip_bad_records: bool = typer.Option(False, "--skip-bad-records",
                                                  help="--from records: leave out those whose text field is missing "
                                                       "or not a string (the manifest counts them) instead of "
                                                       "stopping at the first"),
            keep_non_text: bool = typer.Option(False, "--keep-non-text",
                                               help="keep the documents that are not text (NUL padding, base64 or "
                                                    "hex data, one-line data dumps), which are dropped otherwise: "
                                                    "builds a corpus as lenx did before it dropped them"),
            progress: Optional[bool] = ProgressOpt):
    """Build a corpus: fetch, extract, dedupe, split by document, tokenize, pack.

    Your own data streams through the build (a corpus larger than memory builds in bounded memory).

    Running it again with the same settings and the same input reuses the corpus (and says so);
    `--force` rebuilds it.

    `code` (the Linux kernel's source tree with tech's and books' text) also drops near-duplicate
    documents (MinHash LSH, with the datasketch package of lenx's `dedup` extra) and reserves 300
    documents of >= 16385 tokens for its test split.

    Prints a short summary: the corpus's tokenizer and vocabulary, one line per split (documents,
    tokens, documents of >= 8192 and >= 16384 tokens) and where its manifest is (<root>/<corpus>/manifest.json,
    everything the build recorded, as JSON); then on stderr how many non-text (and near-duplicate) documents were dropped.
    """
    from ..data.build import prepare_corpus
    from ..data.build.documents import input_notes
    from ..data.build.neardup import summary_line as near_dup_line
    from ..data.build.nontext import summary_line
    from ..fileio import check_writable_dir
    from ..report.corpus_summary import corpus_summary, skipped_records

    try:
        check_writable_dir(root, "--root")
        check_writable_dir(root / corpus, "the corpus folder")
        manifest = prepare_corpus(corpus, root, from_path=from_path, tokenizer=tokenizer, vocab_size=vocab_size,
                                  seed=seed, force=force, allow_missing_sources=allow_missing_sources,
                                  long_test=long_test, long_test_tokens=long_test_tokens, progress=_progress(progress),
                                  skip_bad_records=skip_bad_records, keep_non_text=keep_non_text,
                                  text_field=text_field, split=split, say=print)
    except _user_errors() as e:
        _fail(e)
    for line in corpus_summary(manifest, root / corpus / "manifest.json"):
        print(line)
    for line in skipped_records(manifest, from_path) + input_notes(manifest, from_path):
        typer.echo(line, err=True)
    for line in (summary_line(manifest), near_dup_line(manifest)):
        if line:
            typer.echo(line, err=True)
