"""Run folders, as training, evaluation, sweeps, reports and the CLI open them: a run's config
(run_config), meta.json (run_meta), weights (run_weights, load_model, load_run) and corpus
(open_training_corpus, check_run_corpus, open_run_corpus). The device: lenx.config.resolve_device;
the precision: lenx.model.precision."""

import json
import os
from pathlib import Path
import sys

import torch

from .config import ConfigError, RunConfig, load_config
from .model import LM, check_config
from .model.checkpoint import CheckpointError, kept_dir, load_weights, weights_dir


def open_training_corpus(cfg: RunConfig):
    from .data import open_corpus
    from .data.build import prepare_corpus

    root = Path(cfg.data.root)
    if cfg.data.corpus == "synthetic" and not (root / "synthetic" / "manifest.json").exists():
        prepare_corpus("synthetic", root, progress=False)  # embedded and generated in seconds
    return open_corpus(cfg.data.corpus, root)


_NOTED: set[str] = set()  # runs whose missing corpus fingerprint was noted in this process


def run_meta(run_dir: Path) -> dict:
    """A run's meta.json, or {} when it is missing or unreadable."""
    try:
        meta = json.loads((Path(run_dir) / "meta.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def check_run_corpus(run_dir: Path, cfg: RunConfig, corpus) -> None:
    """Refuse (a one-line DataError) a corpus that is not the one the run was trained on: another
    vocabulary size than the run's model, or another fingerprint than meta.json records (what
    changed: the tokenizer, which splits). A run trained before runs recorded fingerprints is
    accepted with a note on stderr (once per run and process), as only its vocabulary size can be
    checked."""
    from .data import DataError
    from .data.layout import fingerprint_changes

    run_dir = Path(run_dir)
    fix = (f"prepare the corpus the run was trained on again (the same input and settings rebuild it exactly), "
           f"or point data.root in {run_dir / 'config.toml'} at a copy of it")
    where = f"corpus {corpus.name!r} at {corpus.root} is not the one {run_dir} was trained on"
    if cfg.model.vocab_size and cfg.model.vocab_size != corpus.vocab_size:
        raise DataError(f"{where}: its vocabulary has {corpus.vocab_size} tokens, the run's model "
                        f"{cfg.model.vocab_size}; {fix}")
    meta = run_meta(run_dir)
    recorded = meta.get("corpus_fingerprint")
    if not isinstance(recorded, dict):
        key = str(run_dir.resolve())
        if key not in _NOTED:
            _NOTED.add(key)
            print(f"note: {run_dir} records no corpus fingerprint (trained before lenx recorded one): lenx cannot "
                  f"check that {corpus.root} still holds the corpus it was trained on", file=sys.stderr)
        return
    changed = fingerprint_changes(recorded, corpus.fingerprint())
    if changed:
        what = ", ".join(changed[:-1]) + " and " + changed[-1] if len(changed) > 1 else changed[0]
        when = ""
        if meta.get("corpus_prepared") and corpus.manifest.get("created"):
            when = f" (the run's was prepared {meta['corpus_prepared']}, this one {corpus.manifest['created']})"
        raise DataError(f"{where}: its {what} {'differ' if len(changed) > 1 else 'differs'}{when}; {fix}")


def open_run_corpus(run_dir: Path, cfg: RunConfig):
    """The corpus of a trained run (its config `cfg`), checked to be the one it was trained on
    (check_run_corpus)."""
    corpus = open_training_corpus(cfg)
    check_run_corpus(run_dir, cfg, corpus)
    return corpus


def absolute_root(root: str) -> str:
    return os.path.abspath(os.path.expanduser(root))


def run_config(run_dir: Path) -> RunConfig:
    """A run's config.toml, checked (lenx.model.check_config), its data.root absolute. Runs recorded
    a relative root before roots were stored absolute; it meant the folder they were trained from,
    most likely the current one, which counts only where the corpus folder exists there (never a
    synthetic corpus generated anew in another place)."""
    run_dir = Path(run_dir)
    path = run_dir / "config.toml"
    if not path.is_file():
        raise CheckpointError(f"{run_dir} is not a lenx run directory (no config.toml); train one with `lenx train`")
    cfg = load_config(path, recorded=True)  # keys newer than the run: the values it trained with
    check_config(cfg)
    root = Path(cfg.data.root).expanduser()
    if not root.is_absolute():
        here = Path.cwd() / root / cfg.data.corpus
        if not here.is_dir():
            raise ConfigError(f"{path} has the relative data.root {cfg.data.root!r} and {here} does not exist; "
                              "set data.root in that file to the corpus's absolute folder, or run from the folder "
                              "the run was trained in")
        cfg.data.root = absolute_root(str(root))
    return cfg


def run_weights(run_dir: Path, step: int | None = None) -> Path:
    """The folder of a run's latest weights, or of the weights it kept at `step`."""
    if step is not None:
        return kept_dir(run_dir, step)
    folder = weights_dir(run_dir)
    if folder is None:
        if any((Path(run_dir) / d).is_dir() for d in ("ckpt", "ckpt.old")):
            raise CheckpointError(f"{run_dir}'s checkpoint has no model.safetensors: its weights are lost; "
                                  f"train it again: lenx train -c {Path(run_dir) / 'config.toml'} -o NEW_DIR")
        raise CheckpointError(f"{run_dir} has no checkpoint yet; train it (or resume it) first")
    return folder


def load_model(cfg: RunConfig, folder: Path, device: torch.device, backend: str | None = None) -> LM:
    """The model of `cfg` with the weights in `folder`, in eval mode on `device`; `backend` overrides
    the attention backend it was trained with."""
    if backend:
        cfg.model.backend = backend
    model = LM(cfg.model)
    load_weights(model, folder)
    return model.to(device).eval()


def load_run(run_dir: Path, device: torch.device, backend: str | None = None,
             step: int | None = None) -> tuple[LM, RunConfig]:
    """The trained model of a run directory (its last checkpoint, or the one kept at `step`, in eval
    mode on `device`) and its config; `backend` overrides the attention backend it was trained with."""
    cfg = run_config(run_dir)
    return load_model(cfg, run_weights(run_dir, step), device, backend), cfg
