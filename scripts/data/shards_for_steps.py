"""Which train shards of a sharded corpus (`lenx shard`) a range of a run's steps reads, so that a
device call carries exactly those.

    python scripts/data/shards_for_steps.py runs/c125 --steps 0:1500         # a run folder: its config.toml
    python scripts/data/shards_for_steps.py 125m --set data.corpus=code --set train.sampling=pass --steps 0:1500
    python scripts/data/shards_for_steps.py runs/c125 --all-files            # + the corpus's other files

RUN is a run folder, a TOML config or a preset, with --set overrides as `lenx train` takes them (a
run folder takes none: its config is fixed). --steps A:B is the range of optimizer steps, B
excluded (default: from the run's checkpoint, or 0, to train.steps). It prints one path a line,
relative to the current folder when it is under it; --json prints the shards with their tokens and
sha256. With train.sampling="pass" the steps read one contiguous range of the stream (whole blocks
of train.pass_block steps); with "random" they read every shard.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import sys


def parse_steps(text: str | None, first: int, total: int) -> tuple[int, int]:
    from lenx.config import ConfigError

    if text is None:
        return first, total
    a, sep, b = text.partition(":")
    try:
        start, end = int(a) if a.strip() else first, int(b) if b.strip() else total
    except ValueError:
        raise ConfigError(f"--steps must be A:B (steps, B excluded; either may be left out), got {text!r}") from None
    if not sep or not 0 <= start < end:
        raise ConfigError(f"--steps must be A:B with 0 <= A < B, got {text!r}")
    if end > total:
        raise ConfigError(f"--steps {text}: the run has {total} steps (train.steps)")
    return start, end


def shown(path: Path) -> str:
    path = Path(os.path.abspath(path))
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("run", help="a run folder, a TOML config or a preset (tiny, small, 125m, 350m)")
    p.add_argument("--set", "-s", action="append", default=[], help="dotted override, repeatable (not for a run folder)")
    p.add_argument("--steps", help="A:B, the optimizer steps (B excluded) [default: the run's next step to train.steps]")
    p.add_argument("--all-files", action="store_true", help="list the corpus's other files too (manifest, tokenizer, "
                   "val and test, the train document index): all a bare machine needs")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)

    from lenx.config import ConfigError, load_config
    from lenx.data import DataError, open_corpus
    from lenx.data.layout import SPLITS, index_file, shard_records, shards_dir, tokens_file
    from lenx.model.checkpoint import CheckpointError, resume_dir, weights_step
    from lenx.runs import run_config
    from lenx.training.batches import needed_shards

    try:
        run = Path(args.run)
        if (run / "config.toml").is_file():
            if args.set:
                raise ConfigError(f"{run} is a run folder: its config.toml is fixed, --set cannot change it")
            cfg = run_config(run)
            ckpt = resume_dir(run)
            first = (weights_step(ckpt) or 0) if ckpt is not None else 0
        else:
            cfg, first = load_config(args.run, args.set), 0
        corpus = open_corpus(cfg.data.corpus, Path(cfg.data.root))
        records = shard_records(corpus.manifest, "train")
        if records is None:
            raise DataError(f"corpus {corpus.name!r} is not sharded: its train split is one file (train.bin); "
                            f"shard it with `lenx shard {corpus.name} --root {cfg.data.root}`")
        if args.steps is None and first >= cfg.train.steps:
            raise ConfigError(f"{run} has finished training (step {first} of {cfg.train.steps}): no step reads a shard")
        start, end = parse_steps(args.steps, first, cfg.train.steps)
        picked = needed_shards(cfg.train, corpus, start, end)
    except (ConfigError, DataError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    folder = shards_dir(corpus.root, "train")
    others = []
    if args.all_files:
        others = [corpus.root / "manifest.json"] + ([corpus.root / "tokenizer.json"]
                                                    if (corpus.root / "tokenizer.json").is_file() else [])
        others += [f(corpus.root, s) for s in SPLITS if s != "train" for f in (tokens_file, index_file)]
        others.append(index_file(corpus.root, "train"))
    if args.json:
        print(json.dumps({"corpus": corpus.name, "sampling": cfg.train.sampling, "steps": [start, end],
                          "shards": [{**records[i], "path": shown(folder / records[i]["file"])} for i in picked],
                          "other_files": [shown(f) for f in others]}, indent=2))
    else:
        if cfg.train.sampling != "pass":
            print(f"note: train.sampling={cfg.train.sampling!r} reads every shard", file=sys.stderr)
        for path in [*others, *(folder / records[i]["file"] for i in picked)]:
            print(shown(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
