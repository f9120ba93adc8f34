"""`lenx eval RUN --task ruler|babilong|<names>`: the synthetic suite (lenx.evaluation.suite) on a run."""

from pathlib import Path

from ..config import ConfigError, resolve_device
from ..model.memory import check_memory, estimate_memory
from ..model.precision import autocast_for
from ..runs import load_model, open_run_corpus, run_config
from . import suite
from .evaluate import (_checkpoint, _header, _write, apply_rope_scaling, check_options, default_lengths,
                       result_name)

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def file_task(text: str) -> str:
    """The name in eval_<name>.json: the group or task names joined by '+' (no commas in file names)."""
    return "+".join(p.strip() for p in text.split(","))


def check_grid(depths=None, samples=None) -> tuple[list[float], int]:
    """The depths (default DEPTHS) and inputs per cell (default 8) of a suite grid, checked."""
    if samples is not None and (isinstance(samples, bool) or samples < 1):
        raise ConfigError(f"--samples must be a positive integer, got {samples!r}")
    depths = list(DEPTHS if depths is None else depths)
    if not depths or any(not 0 <= d <= 1 for d in depths):
        raise ConfigError(f"depths must be numbers in [0, 1], got {depths!r}")
    return depths, samples or 8


def evaluate_suite(run_dir: Path, task: str, lengths=None, depths=None, samples=None, device="auto", backend=None,
                   step=None, rope_scaling=None, rope_scaling_factor=None, progress=True, write=True) -> dict:
    """Every suite task of `task` on lengths x depths (default: as for --task passkey); writes
    eval_<file_task(task)>.json. Checks everything (names, lengths, corpus size, memory at the longest
    length) before any model is run."""
    run_dir = Path(run_dir)
    tasks = suite.parse_tasks(task)
    check_options(lengths, None, None, None, step)
    depths, samples = check_grid(depths, samples)
    cfg = run_config(run_dir)
    scaling = apply_rope_scaling(cfg, rope_scaling, rope_scaling_factor)
    e = cfg.eval
    lengths = sorted(set(lengths or e.lengths or default_lengths(cfg.train.seq_len, e.max_length)))
    dev = resolve_device(device, "device")
    corpus = open_run_corpus(run_dir, cfg)
    # a too-short length (needles vary by instance) or a too-small split fails here, before the model loads
    for t in tasks:
        for L in {lengths[0], lengths[-1]}:
            for d in depths:
                for i in range(samples):
                    suite.build_case(corpus, t, L, d, i, e.seed, e.split)
    # one input (plus its answer) at the longest length, no gradient
    check_memory(estimate_memory(cfg.model, 1, lengths[-1] + 16, dev, cfg.train.precision, training=False), dev,
                 f"the {file_task(task)} suite at length {lengths[-1]}", "pass shorter --lengths")
    folder, at_step, finished = _checkpoint(run_dir, cfg, step)
    model = load_model(cfg, folder, dev, backend)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(tasks) * len(lengths) * len(depths), desc=f"{file_task(task)} {cfg.model.method}",
                   unit="cell", dynamic_ncols=True)
    grid = suite.run_suite(model, corpus, tasks, lengths, depths, samples, e.seed, e.split, dev,
                           lambda: autocast_for(dev, cfg.train.precision),
                           progress=None if bar is None else (lambda *_: bar.update(1)))
    if bar is not None:
        bar.close()
    result = _header(run_dir, cfg, at_step, finished, scaling, corpus) | grid | {
        "task": file_task(task), "backends": model.backends(dev), "device": str(dev)}
    if write:
        _write(run_dir, result_name(step, rope_scaling, file_task(task)), result)
    return result
