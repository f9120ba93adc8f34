"""Train and evaluate several methods with the same data, seed, budget and evaluation windows.

With jobs > 1 the methods run side by side, each in its own process; on a machine with GPUs each
process sees one GPU (CUDA_VISIBLE_DEVICES), so N GPUs run N methods at once.

Rerunning a sweep reuses what matches the request: a run trained with the requested [model],
[train] and [data] sections is resumed if unfinished, and its eval.json is reused only when it is
of the finished run with the requested evaluation settings (otherwise it is evaluated again; the
run's [eval] section follows the request; the evaluation it replaces is kept, lenx.evaluation.files). A
run trained with other settings, or on another version of the corpus (its fingerprint in meta.json),
is an error that names them, or with force=True is moved aside to <method>.old-<time> and trained
again.
"""

import copy
from dataclasses import asdict
import json
import os
from pathlib import Path
import subprocess
import sys
import time

from ..config import ConfigError, RunConfig, load_config, to_toml
from ..evaluation.evaluate import check_options, eval_settings, evaluate
from ..model import check_device, check_training_memory
from ..model.checkpoint import weights_dir, weights_step
from ..report.eval_tables import sweep_markdown
from ..runs import absolute_root, open_training_corpus, run_meta
from .loop import train
from .metrics import read_metrics

TRAINING_SECTIONS = ("model", "train", "data")  # what the trained weights depend on


class SweepError(RuntimeError):
    pass


def _run_configs(methods: list[str], cfg: RunConfig, seeds: list[int] | None) -> dict[str, RunConfig]:
    """{run name: its config}: <method>, or <method>-s<seed> for each seed when seeds are given."""
    if cfg.model.layers.strip():  # each layer's method would replace every run's: the runs would be one model
        raise SweepError(f"model.layers={cfg.model.layers} gives every layer its method, so the runs of --methods "
                         "would all be one model: leave model.layers out of a sweep (train a layout with lenx train)")
    cfgs = {}
    for method in methods:
        for seed in seeds if seeds is not None else [None]:
            run_cfg = copy.deepcopy(cfg)
            run_cfg.model.method = method
            if seed is not None:
                run_cfg.train.seed = seed
            cfgs[method if seed is None else f"{method}-s{seed}"] = run_cfg
    return cfgs


def _as_recorded(cfg: RunConfig, vocab_size: int) -> RunConfig:
    """`cfg` as a new run records it in config.toml."""
    cfg = copy.deepcopy(cfg)
    cfg.data.root = absolute_root(cfg.data.root)
    cfg.model.vocab_size = vocab_size
    return cfg


def _saved_config(run_dir: Path) -> RunConfig | None:
    path = run_dir / "config.toml"
    if not path.is_file():
        return None
    saved = load_config(path, recorded=True)
    saved.data.root = absolute_root(saved.data.root)
    return saved


def config_differences(saved: RunConfig, requested: RunConfig, sections=TRAINING_SECTIONS) -> list[str]:
    """'section.key: saved in the run, requested requested' for every key that differs."""
    diffs = []
    for section in sections:
        have, want = asdict(getattr(saved, section)), asdict(getattr(requested, section))
        for key in want:
            if have.get(key) != want[key]:
                diffs.append(f"{section}.{key}: {have.get(key)!r} in the run, {want[key]!r} requested")
    return diffs


def _eval_options(eval_kwargs: dict | None) -> dict:
    """The evaluate() options that change what is measured."""
    return {k: v for k, v in (eval_kwargs or {}).items() if k in ("lengths", "windows", "scored")}


def _run_state(run_dir: Path, eval_kwargs: dict | None) -> str:
    """'new' (never trained), 'partial' (training to finish), 'trained' (to evaluate), or 'done':
    its eval.json is of the finished run, measured as requested."""
    saved = _saved_config(run_dir)
    if saved is None:
        return "new"
    folder = weights_dir(run_dir)
    step = weights_step(folder) if folder is not None else None
    if step != saved.train.steps:
        return "partial"
    try:
        result = json.loads((run_dir / "eval.json").read_text())
    except (OSError, ValueError):
        return "trained"
    settings = eval_settings(saved, **_eval_options(eval_kwargs))
    # an eval.json without window_distinct_documents drew its windows before they were made distinct
    current = isinstance(result, dict) and result.get("step") == step and result.get("finished") is True \
        and "window_distinct_documents" in result and all(result.get(key) == value for key, value in settings.items()) \
        and (not saved.eval.per_position or "per_position" in result)  # eval.per_position asked for the bins
    return "done" if current else "trained"


def _train_and_evaluate(run_cfg: RunConfig, run_dir: Path, progress: bool, eval_kwargs: dict | None) -> dict:
    """One method: train (resuming a partial run), then evaluate, unless its evaluation is current.
    Its memory was checked (or the check turned off) with every other run's, before any trained."""
    state = _run_state(run_dir, eval_kwargs)
    if state == "done":
        return json.loads((run_dir / "eval.json").read_text())
    if state in ("new", "partial"):
        summary = train(run_cfg, run_dir, resume=state == "partial", progress=progress, memory_check=False)
        if not summary["finished"]:
            raise SweepError(f"{run_cfg.model.method}: training stopped early")
    result = evaluate(run_dir, progress=progress, **(eval_kwargs or {}))
    if result["finished"] is not True:
        raise SweepError(f"{run_cfg.model.method}: {run_dir} evaluated at step {result['step']}, not a finished run")
    return result


def _corpus_differences(run_dir: Path, corpus) -> list[str]:
    """The corpus change since the run was trained, as config_differences words it: the parts of
    the fingerprint that meta.json records and the corpus no longer has (none recorded: none)."""
    from ..data.layout import fingerprint_changes

    recorded = run_meta(run_dir).get("corpus_fingerprint")
    if not isinstance(recorded, dict):
        return []
    changed = fingerprint_changes(recorded, corpus.fingerprint())
    return [f"data.corpus: {corpus.name!r} was prepared anew since the run was trained ({', '.join(changed)} "
            "changed)"] if changed else []


def _reconcile(out_dir: Path, cfgs: dict[str, RunConfig], corpus, force: bool) -> None:
    """Check the existing runs against the request before anything trains: a run trained with other
    training settings, or on another version of the corpus, is an error (force: moved aside); one
    with other [eval] settings takes the requested ones."""
    stale, new_eval = {}, []
    for method, cfg in cfgs.items():
        saved = _saved_config(out_dir / method)
        if saved is None:
            continue
        diffs = config_differences(saved, _as_recorded(cfg, corpus.vocab_size)) + \
            _corpus_differences(out_dir / method, corpus)
        if diffs:
            stale[method] = diffs
        elif asdict(saved.eval) != asdict(cfg.eval):
            saved.eval = copy.deepcopy(cfg.eval)
            new_eval.append((method, saved))
    if stale and not force:
        listed = "; ".join(f"{method}: " + ", ".join(diffs) for method, diffs in stale.items())
        raise SweepError(f"{out_dir} holds runs trained with other settings ({listed}); use another --out, or "
                         "--force to move those runs aside and train them again")
    for method in stale:
        aside = out_dir / f"{method}.old-{time.strftime('%Y%m%d-%H%M%S')}"
        n = 1
        while aside.exists():
            n += 1
            aside = aside.with_name(f"{method}.old-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
        os.replace(out_dir / method, aside)
        print(f"[sweep] {method}: trained with other settings; moved to {aside}, training again", flush=True)
    for method, saved in new_eval:
        (out_dir / method / "config.toml").write_text(to_toml(saved))


def _job(run_dir: str, config_path: str, eval_kwargs: str) -> None:
    """Entry point of one method's process in a parallel sweep (see _run_parallel)."""
    _train_and_evaluate(load_config(config_path), Path(run_dir), False, json.loads(eval_kwargs))


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries."""
    import torch

    if not torch.cuda.is_available():
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else []
    return (ids or [str(i) for i in range(torch.cuda.device_count())])[:torch.cuda.device_count()]


def _run_parallel(cfgs: dict[str, RunConfig], out_dir: Path, jobs: int, eval_kwargs: dict | None) -> None:
    """Train and evaluate the unfinished methods, `jobs` processes at a time. Process i of the
    running set gets GPU i (round robin when jobs > GPUs); on CPUs they split the cores. Each logs
    to <run>/sweep.log. A failed method does not stop the others; the failures are raised at the end."""
    cfg = next(iter(cfgs.values()))
    gpus = visible_gpus() if cfg.train.device != "cpu" else []
    jobs = jobs or max(1, len(gpus))
    pending = [m for m in cfgs if _run_state(out_dir / m, eval_kwargs) != "done"]
    if not pending:
        return
    threads = str(max(1, (os.cpu_count() or 1) // min(jobs, len(pending))))
    running: dict[int, tuple[str, subprocess.Popen, float]] = {}  # slot -> (method, process, start time)
    failed = []
    entry = "import sys; from lenx.training.sweep import _job; _job(*sys.argv[1:])"
    try:
        while pending or running:
            for slot in range(jobs):
                if slot in running or not pending:
                    continue
                method = pending.pop(0)
                run_dir = out_dir / method
                run_dir.mkdir(parents=True, exist_ok=True)
                config_path = run_dir / "sweep_job.toml"
                config_path.write_text(to_toml(cfgs[method]))
                env = dict(os.environ)
                env.setdefault("OMP_NUM_THREADS", threads)  # N processes on one CPU must not each take every core
                where = "CPU"
                if gpus:
                    env["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]
                    where = f"GPU {env['CUDA_VISIBLE_DEVICES']}"
                with open(run_dir / "sweep.log", "a") as log:
                    proc = subprocess.Popen([sys.executable, "-c", entry, str(run_dir), str(config_path),
                                             json.dumps(eval_kwargs or {})], stdout=log, stderr=subprocess.STDOUT,
                                            env=env)
                running[slot] = (method, proc, time.time())
                print(f"[sweep] {method}: started on {where} (log: {run_dir / 'sweep.log'})", flush=True)
            time.sleep(0.2)
            for slot, (method, proc, t0) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[slot]
                if proc.returncode == 0:
                    print(f"[sweep] {method}: done in {time.time() - t0:.0f} s", flush=True)
                else:
                    failed.append(method)
                    print(f"[sweep] {method}: FAILED (exit {proc.returncode})", flush=True)
    finally:
        # Interrupted: each training process checkpoints its current step and exits on SIGTERM
        # (or on the Ctrl-C it got too); waiting for them leaves no orphan and no cut checkpoint.
        for _, proc, _ in running.values():
            proc.terminate()
        for _, proc, _ in running.values():
            proc.wait()
    if failed:
        lines = []
        for method in failed:
            log = out_dir / method / "sweep.log"
            tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:]
            lines.append(f"{method} ({log}): {tail[0] if tail else 'no output'}")
        raise SweepError("methods failed in the parallel sweep; finished ones are kept, rerun to retry:\n  "
                         + "\n  ".join(lines))


def loss_curves(runs: dict[str, Path]) -> tuple[dict, dict]:
    """({name: [[step, loss], ...]}, {name: [[step, val_loss], ...]}) of run folders, for loss.png
    (a run with no validation loss has no entry in the second)."""
    curves, val_curves = {}, {}
    for name, run_dir in runs.items():
        records = read_metrics(Path(run_dir) / "metrics.jsonl", notes=False)
        curves[name] = [[r["step"], r["loss"]] for r in records if "loss" in r]
        if any("val_loss" in r for r in records):
            val_curves[name] = [[r["step"], r["val_loss"]] for r in records if "val_loss" in r]
    return curves, val_curves


def sweep(methods: list[str], cfg: RunConfig, out_dir: Path, progress: bool = True,
          eval_kwargs: dict | None = None, jobs: int = 1, force: bool = False, seeds: list[int] | None = None,
          memory_check: bool = True) -> dict:
    """Each method gets runs/<out_dir>/<method> (with seeds: <method>-s<seed> per seed, each result
    carrying its "seed"); a finished run is not trained again, a partial one
    resumes, and an evaluation is reused only when it answers this request (see the module's
    docstring). Every method's config and the evaluation options are checked before anything
    trains, and with memory_check that each method's training step fits the device; a run trained
    with other settings is an error, or with force=True is moved aside and trained again. Writes
    results.json, results.md and the figures into out_dir. jobs != 1 runs that many methods at once
    in separate processes (0: one per visible GPU)."""
    from ..report.plot import redraw_file

    out_dir = Path(out_dir)
    cfgs = _run_configs(methods, cfg, seeds)
    options = eval_kwargs or {}
    check_options(token_budget=options.get("token_budget"))
    for run_cfg in cfgs.values():  # every run's config, its device and its evaluation, before any trains
        device = check_device(run_cfg, run_cfg.train.device)  # the whole config against the model, then the device
        eval_settings(run_cfg, **_eval_options(options))
    corpus = open_training_corpus(_as_recorded(cfg, 0))  # builds a missing synthetic corpus once
    if memory_check:  # each method's training step on the device (its seeds take the same memory)
        for method, run_cfg in {c.model.method: c for c in cfgs.values()}.items():
            try:
                check_training_memory(_as_recorded(run_cfg, corpus.vocab_size), device)
            except ConfigError as e:
                raise ConfigError(f"{method}: {e}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    _reconcile(out_dir, cfgs, corpus, force)
    if jobs != 1:
        _run_parallel(cfgs, out_dir, jobs, eval_kwargs)
    results = []
    for name, run_cfg in cfgs.items():
        result = _train_and_evaluate(run_cfg, out_dir / name, progress, eval_kwargs)
        results.append(result | ({"seed": run_cfg.train.seed} if seeds is not None else {}))
    curves, val_curves = loss_curves({name: out_dir / name for name in cfgs})
    summary = {"methods": methods, "seeds": seeds, "config": to_toml(cfg), "runs": results, "curves": curves,
               "val_curves": val_curves}
    (out_dir / "results.json").write_text(json.dumps(summary, indent=2))
    (out_dir / "results.md").write_text(sweep_markdown(results))
    figures = redraw_file(out_dir / "results.json")  # the figures `lenx plot` would draw: no ΔP one without ΔP
    return {"results": results, "figures": [str(f) for f in figures],
            "out_dir": str(out_dir)}
