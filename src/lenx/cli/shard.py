"""`lenx shard`: cut a prepared corpus's train stream into shard files (and join them back, check them)."""

import json
from pathlib import Path
from typing import Optional

import typer

from . import _command, _fail, _user_errors

SIZE_HELP = ("tokens per shard (30M; K, M, G are 10^3, 10^6, 10^9) or bytes per shard file (40MiB, 60MB); "
             "default 30M: 60 MB of uint16 tokens, under 60 MiB even uncompressed, and xz -6 shrinks the code "
             "corpus's train tokens to 23-25% (three samples of 32 MiB), so a shard travels as about 14 MiB; at most "
             "1,000 shards (a run sampling at random keeps each one open)")


@_command("shard")
def shard_cmd(corpus: str = typer.Argument(..., help="a prepared corpus (lenx prepare NAME)"),
              root: Path = typer.Option(Path("data"), help="where corpora live"),
              size: Optional[str] = typer.Option(None, "--size", help=SIZE_HELP),
              remove_bin: bool = typer.Option(False, "--remove-bin", help="delete train.bin once the shards are "
                                              "recorded (the corpus opens without it)"),
              join: bool = typer.Option(False, "--join", help="write the shards back into one train.bin and drop "
                                        "them (every shard must be here)"),
              check: bool = typer.Option(False, "--check", help="say which shards are here and match the manifest's "
                                         "sha256 (exit 1 if one here is damaged)"),
              as_json: bool = typer.Option(False, "--json", help="print JSON instead of a sentence")):
    """Cut a corpus's train split into shard files that a machine can take one call at a time.

    The shards (`<root>/<corpus>/train.shards/00000.bin`, ...) are the train stream cut in order; the
    manifest lists each one's start, tokens and sha256 and keeps its fingerprint (the same content).

    They are written aside and recorded last, so a killed `lenx shard` leaves the corpus as it was.

    A sharded corpus opens without train.bin and reads a shard when a step first reaches it: a run
    with train.sampling="pass" needs only the shards of its steps (scripts/data/shards_for_steps.py
    lists them), one with random sampling needs all. val and test stay whole files.
    """
    from ..config import ConfigError
    from ..data import open_corpus
    from ..data.layout import shards_dir
    from ..data.sharding import DEFAULT_SIZE, check_shards, join_shards, shard_corpus
    from ..fileio import check_writable_dir

    try:
        if join and (size is not None or remove_bin or check):
            raise ConfigError("--join writes train.bin back from the shards; it takes no --size, --remove-bin or --check")
        if check and (size is not None or remove_bin):
            raise ConfigError("--check only reads the shards; it takes no --size or --remove-bin")
        if check:
            found = check_shards(open_corpus(corpus, root))
        else:
            open_corpus(corpus, root)  # an unknown or unprepared corpus says so before the folder's access
            check_writable_dir(root / corpus, "the corpus folder")
            if join:
                joined = join_shards(corpus, root)
            else:
                entry = shard_corpus(corpus, root, size or DEFAULT_SIZE, remove_bin)
    except _user_errors() as e:
        _fail(e)
    where = shards_dir(root / corpus, "train")
    if check:
        _report_check(corpus, where, found, as_json)
    elif join:
        print(json.dumps({"corpus": corpus, "joined": joined}) if as_json else
              f"corpus {corpus}: {joined} train shards joined into {root / corpus / 'train.bin'}")
    else:
        _report_shards(corpus, root, where, entry, as_json)


def _report_shards(corpus: str, root: Path, where: Path, entry: dict, as_json: bool) -> None:
    files, per = entry["files"], entry["tokens_per_shard"]
    kept = (root / corpus / "train.bin").is_file()
    if as_json:
        print(json.dumps({"corpus": corpus, "dir": str(where), "tokens_per_shard": per, "train_bin_kept": kept,
                          "shards": files}))
        return
    from ..data import open_corpus

    total, itemsize = sum(f["tokens"] for f in files), open_corpus(corpus, root).token_dtype.itemsize
    print(f"corpus {corpus}: train split ({total:,} tokens) in {len(files)} shards of up to {per:,} tokens "
          f"({per * itemsize / 1e6:.1f} MB) in {where}")
    if kept:
        print(f"train.bin is kept; the corpus opens without it: lenx shard {corpus} --remove-bin (or delete it)")


def _report_check(corpus: str, where: Path, found: list, as_json: bool) -> None:
    rows = [{"file": r["file"], "tokens": r["tokens"], "state": "ok" if why is None else
             "missing" if why == "is missing" else "damaged", "why": why} for r, why in found]
    if as_json:
        print(json.dumps({"corpus": corpus, "dir": str(where), "shards": rows}))
    else:
        ok = sum(r["state"] == "ok" for r in rows)
        missing = [r["file"] for r in rows if r["state"] == "missing"]
        damaged = [f"{r['file']} ({r['why']})" for r in rows if r["state"] == "damaged"]
        line = f"corpus {corpus}: {len(rows)} train shards in {where}: {ok} here and intact"
        line += f"; missing: {', '.join(missing)}" if missing else ""
        line += f"; damaged: {', '.join(damaged)}" if damaged else ""
        print(line)
    if any(r["state"] == "damaged" for r in rows):
        raise typer.Exit(1)
