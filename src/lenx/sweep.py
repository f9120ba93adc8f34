"""Train and evaluate several methods with the same data, seed, budget and evaluation windows.

With jobs > 1 the methods run side by side, each in its own process; on a machine with GPUs each
process sees one GPU (CUDA_VISIBLE_DEVICES), so N GPUs run N methods at once.
"""

import json
import os
from pathlib import Path
import subprocess
import sys
import time

from dataclasses import replace

from .checkpoint import checkpoint_dir
from .config import RunConfig, load_config, to_toml
from .evaluate import evaluate
from .runtime import open_training_corpus
from .train import train


class SweepError(RuntimeError):
    pass


def results_table(results: list[dict], key: str = "ppl") -> str:
    """Markdown table: methods x lengths."""
    lengths = sorted({int(L) for r in results for L in r["results"]})
    head = "| method | " + " | ".join(str(L) for L in lengths) + " |"
    rule = "|---|" + "---|" * len(lengths)
    rows = []
    for r in results:
        cells = [f"{r['results'][str(L)][key]:.2f}" if key in r["results"].get(str(L), {}) else "" for L in lengths]
        rows.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    return "\n".join([head, rule] + rows)


def _is_done(run_dir: Path) -> bool:
    return checkpoint_dir(run_dir) is not None and (run_dir / "eval.json").exists()


def _train_and_evaluate(run_cfg: RunConfig, run_dir: Path, progress: bool, eval_kwargs: dict | None) -> dict:
    """One method: train (resuming a partial run), then evaluate."""
    summary = train(run_cfg, run_dir, resume=checkpoint_dir(run_dir) is not None, progress=progress)
    if not summary["finished"]:
        raise SweepError(f"{run_cfg.model.method}: training stopped early")
    return evaluate(run_dir, progress=progress, **(eval_kwargs or {}))


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


def _run_parallel(methods: list[str], cfg: RunConfig, out_dir: Path, jobs: int, eval_kwargs: dict | None) -> None:
    """Train and evaluate the unfinished methods, `jobs` processes at a time. Process i of the
    running set gets GPU i (round robin when jobs > GPUs); on CPUs they split the cores. Each logs
    to <run>/sweep.log. A failed method does not stop the others; the failures are raised at the end."""
    gpus = visible_gpus() if cfg.train.device != "cpu" else []
    jobs = jobs or max(1, len(gpus))
    pending = [m for m in methods if not _is_done(out_dir / m)]
    if not pending:
        return
    open_training_corpus(cfg)  # build the corpus once here, not in several processes at the same time
    threads = str(max(1, (os.cpu_count() or 1) // min(jobs, len(pending))))
    running: dict[int, tuple[str, subprocess.Popen, float]] = {}  # slot -> (method, process, start time)
    failed = []
    entry = "import sys; from lenx.sweep import _job; _job(*sys.argv[1:])"
    try:
        while pending or running:
            for slot in range(jobs):
                if slot in running or not pending:
                    continue
                method = pending.pop(0)
                run_dir = out_dir / method
                run_dir.mkdir(parents=True, exist_ok=True)
                config_path = run_dir / "sweep_job.toml"
                config_path.write_text(to_toml(replace(cfg, model=replace(cfg.model, method=method))))
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
        for _, proc, _ in running.values():  # interrupted: leave no orphan training processes
            proc.terminate()
    if failed:
        lines = []
        for method in failed:
            log = out_dir / method / "sweep.log"
            tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:]
            lines.append(f"{method} ({log}): {tail[0] if tail else 'no output'}")
        raise SweepError("methods failed in the parallel sweep; finished ones are kept, rerun to retry:\n  "
                         + "\n  ".join(lines))


def sweep(methods: list[str], cfg: RunConfig, out_dir: Path, progress: bool = True,
          eval_kwargs: dict | None = None, jobs: int = 1) -> dict:
    """Each method gets runs/<out_dir>/<method>; a finished run is not trained again, a partial one
    resumes. Writes results.json, results.md and the figures into out_dir. jobs != 1 runs that many
    methods at once in separate processes (0: one per visible GPU)."""
    from .plot import plot_delta_p, plot_perplexity

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if jobs != 1:
        _run_parallel(methods, cfg, out_dir, jobs, eval_kwargs)
    results = []
    for method in methods:
        run_cfg = replace(cfg, model=replace(cfg.model, method=method))
        run_dir = out_dir / method
        if _is_done(run_dir):
            results.append(json.loads((run_dir / "eval.json").read_text()))
        else:
            results.append(_train_and_evaluate(run_cfg, run_dir, progress, eval_kwargs))
    summary = {"methods": methods, "config": to_toml(cfg), "runs": results}
    (out_dir / "results.json").write_text(json.dumps(summary, indent=2))
    md = ["# Sweep results", "", f"Perplexity of the last {results[0]['scored']} tokens, trained at "
          f"{results[0]['train_len']} on `{results[0]['corpus']}`; {results[0]['window_note']}.", "",
          results_table(results, "ppl"), "", "ΔP (positive: context beyond the training length helps):", "",
          results_table(results, "delta_p"), ""]
    (out_dir / "results.md").write_text("\n".join(md))
    figures = [plot_perplexity(results, out_dir / "perplexity.png"), plot_delta_p(results, out_dir / "delta_p.png")]
    return {"results": results, "table": results_table(results), "figures": [str(f) for f in figures],
            "out_dir": str(out_dir)}
