"""The CHE length-generalisation protocol (Deletang et al. 2023, as set up by Ruoss et al. 2023).

An encoder (non-causal) transformer, 5 layers, d 64, 8 heads, FFN x4 with ReLU, dropout 0.1, with any
lenx attention method in its bidirectional form, reads the task's input followed by |y| blank
positions and predicts the output from those positions. Training lengths are uniform in 1..40; the
test covers every length 41..500 with 512 samples each; the score is the masked per-token argmax
accuracy (up to the terminator for the padded tasks) averaged over the test lengths.

How each method is made bidirectional: ALiBi, Kerple and FIRE use |i - j| (FIRE normalises by
max(i, j)); T5 gives each direction its own 16 buckets; Transformer-XL uses signed distances; RoPE
and NoPE need no change; DAPE / DAPE V2 see the whole score map (no tril). CoPE, stick-breaking and
FoX are directional by construction: they run causally (see `runs_causally`); the answer positions come
after the whole input, so a causal model still reads all of it. A layout's windowed layer (`rope:w16`)
runs causally too: its window is each query's W most recent keys.
"""

from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
import json
import math
import os
from pathlib import Path
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..attention.layouts import layer_configs, method_or_layout
from ..attention.methods import UnknownMethodError, parse_method
from ..config import ConfigError, LMConfig, resolve_device
from ..model.lm import Block
from ..model.memory import check_memory, estimate_memory
from ..model.precision import autocast_for
from ..report.che_tables import che_table
from ..report.tables import to_markdown
from ..runinfo import git_commit
from ..tasks import TASKS, get_task
from ..training.step import train_step


class CHEError(ValueError):
    """A CHE input the user can fix (the protocol, the output folders, the settings); one line."""


@dataclass
class CHEConfig:
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    methods: list[str] = field(default_factory=lambda: ["rope", "alibi", "kerple", "dape-kerple", "dapev2-kerple"])
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    steps: int = 10000
    batch_size: int = 128
    lr: float = 1e-3
    grad_clip: float = 1.0
    train_max_length: int = 40
    test_min_length: int = 41
    test_max_length: int = 500
    test_length_step: int = 1
    test_samples: int = 512
    n_layer: int = 5
    d_model: int = 64
    n_head: int = 8
    dropout: float = 0.1
    device: str = "auto"


PRESETS = {
    # CPU smoke test: every task x method in minutes; numbers mean nothing.
    "smoke": dict(steps=20, seeds=[0], batch_size=16, test_max_length=56, test_length_step=5, test_samples=16,
                  n_layer=2),
    # One GPU, a few minutes per task-method pair.
    "gpu": dict(steps=10000, seeds=[0, 1], test_samples=512),
    # The paper's budget.
    "paper": dict(steps=200000, seeds=[0, 1, 2], test_samples=512),
}


# `lenx che` tests at most this many times the paper's test work without --force (check_test_size)
TEST_BUDGET = 10


def runs_causally(method: str) -> bool:
    """Stick-breaking, CoPE, FoX (they walk the keys backwards: sticks, gates, forget gates) and MTA (its
    query convolution reads earlier queries) have no bidirectional form: in CHE they run causally."""
    return parse_method(method).causal_only


class Encoder(nn.Module):
    """Token + blank embedding, lenx blocks (non-causal unless the method is directional or the layer
    windowed; a layout's layers each by their own method), a classification head per position."""

    def __init__(self, method: str, vocab: int, classes: int, cfg: CHEConfig):
        super().__init__()
        c, shared = block_config(method, cfg), {}
        self.embed = nn.Embedding(vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(replace(b, causal=runs_causally(b.method) or b.window > 0), shared, i)
                                    for i, b in enumerate(layer_configs(c, c.layers, c.n_layer)))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, classes)

    def forward(self, tokens):
        x, memo = self.embed(tokens), {}  # memo: what the layers share in this forward (a temperature's table)
        for block in self.blocks:
            x = block(x, memo=memo)
        return self.head(self.norm(x))


def block_config(method: str, cfg: CHEConfig) -> LMConfig:
    """The encoder's blocks; `method` may be a layout (attention.layouts); log-n's L: the longest task length."""
    base, layers = method_or_layout(method)
    return LMConfig(method=base, layers=layers, causal=runs_causally(base), n_layer=cfg.n_layer, n_head=cfg.n_head,
                    d_model=cfg.d_model, activation="relu", dropout=cfg.dropout, temp_train_len=cfg.train_max_length)


def check_che_memory(cfg: CHEConfig) -> None:
    """Refuse, in one line, a method whose training step (on the longest training sequences of any
    of the tasks) or test forward (128 sequences of the longest test length at once) does not fit
    the device's memory (lenx.model.memory)."""
    device = resolve_device(cfg.device, "device")
    tasks = [get_task(t) for t in cfg.tasks]
    longest = lambda n: max(t.input_length(n) + t.output_length(n) for t in tasks)  # noqa: E731
    vocab, classes = max(t.input_vocab + 1 for t in tasks), max(t.output_vocab for t in tasks)
    for method in cfg.methods:
        with torch.random.fork_rng(devices=[]):  # a few hundred thousand weights: built in milliseconds
            params = sum(p.numel() for p in Encoder(method, vocab, classes, cfg).parameters())
        phases = [
            (True, cfg.batch_size, longest(cfg.train_max_length),
             f"training on lengths up to {cfg.train_max_length}", "use a smaller preset (its batch size)"),
            (False, min(128, cfg.test_samples), longest(cfg.test_max_length),
             f"testing at length {cfg.test_max_length}", "lower --test-max-length")]
        for training, batch, length, doing, lower in phases:
            estimate = estimate_memory(block_config(method, cfg), batch, length, device, training=training,
                                       params=params, outputs=classes)
            try:
                check_memory(estimate, device, f"{method}: {doing} ({batch} sequences of {length} tokens at once)",
                             lower)
            except ConfigError as e:
                raise CHEError(str(e)) from None


def check_test_size(cfg: CHEConfig) -> None:
    """Refuse, in one line, a test whose work exceeds TEST_BUDGET times the paper's (counted as there) for
    each task, method and seed: it names its size and the longest --test-max-length within the bound.
    The sum stops at the bound, so a test of hours is refused in milliseconds."""
    tasks = [get_task(t) for t in cfg.tasks]
    work = lambda n: max((t.input_length(n) + t.output_length(n)) ** 2 for t in tasks)  # noqa: E731
    paper = CHEConfig()
    budget = TEST_BUDGET * paper.test_samples * sum(
        work(n) for n in range(paper.test_min_length, paper.test_max_length + 1, paper.test_length_step))
    lengths = range(cfg.test_min_length, cfg.test_max_length + 1, cfg.test_length_step)
    total, within = 0, None
    for n in lengths:
        total += cfg.test_samples * work(n)
        if total > budget:
            break
        within = n
    else:
        return
    longest = max(t.input_length(cfg.test_max_length) + t.output_length(cfg.test_max_length) for t in tasks)
    fits = (f"with these settings it stays within up to --test-max-length {within}" if within is not None else
            "even the shortest test length exceeds it with these settings (lower --test-samples)")
    raise CHEError(f"--test-max-length {cfg.test_max_length} would test {len(lengths):,} lengths x {cfg.test_samples} "
                   f"samples of up to {longest:,} tokens per task, method and seed, over {TEST_BUDGET} times the "
                   f"paper's test (lengths {paper.test_min_length}..{paper.test_max_length}, {paper.test_samples} "
                   f"samples each); {fits}; pass --force to run it anyway")


def train_and_test(task_name: str, method: str, seed: int, cfg: CHEConfig, progress=None) -> dict:
    """Train one model on one task with one seed; return per-length test accuracy."""
    task = get_task(task_name)
    device = resolve_device(cfg.device, "device")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = Encoder(method, task.input_vocab + 1, task.output_vocab, cfg).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    amp = partial(autocast_for, device, "auto")  # bf16 on CUDA

    def masked_loss(x, y, mask):
        return F.cross_entropy(model(x)[mask].float(), y[mask])

    t0 = time.perf_counter()
    model.train()
    for step in range(cfg.steps):
        length = int(rng.integers(1, cfg.train_max_length + 1))
        batch = tuple(t.to(device) for t in task.sample(cfg.batch_size, length, rng))
        loss, _ = train_step(model, opt, [batch], masked_loss, clip=cfg.grad_clip, autocast=amp)
        if progress is not None:
            progress(1)
    if device.type == "cuda":  # the GPU runs ahead of the host: wait for it before reading the clock
        torch.cuda.synchronize(device)
    train_time = time.perf_counter() - t0

    t0 = time.perf_counter()
    model.eval()
    test_rng = np.random.default_rng(10_000 + seed)  # the same test set for every method
    per_length = {}
    lengths = range(cfg.test_min_length, cfg.test_max_length + 1, cfg.test_length_step)
    for length in lengths:
        correct = total = 0
        for start in range(0, cfg.test_samples, 128):
            n = min(128, cfg.test_samples - start)
            x, y, mask = (t.to(device) for t in task.sample(n, length, test_rng))
            with torch.no_grad(), amp():
                pred = model(x).argmax(-1)
            scored = task.accuracy_mask(y, mask)
            correct += int(((pred == y) & scored).sum())
            total += int(scored.sum())
        per_length[length] = correct / total
    test_time = time.perf_counter() - t0  # .sum() above already synchronises with the GPU
    return {"task": task_name, "method": method, "seed": seed, "final_train_loss": float(loss),
            "accuracy": float(np.mean(list(per_length.values()))), "per_length": per_length,
            "train_time_s": train_time, "test_time_s": test_time}


# The config fields that change what a run measures; runs are only comparable (resumable, mergeable)
# when these agree. Device, task/method/seed lists are not part of it.
PROTOCOL_FIELDS = ("steps", "batch_size", "lr", "grad_clip", "train_max_length", "test_min_length",
                   "test_max_length", "test_length_step", "test_samples", "n_layer", "d_model", "n_head", "dropout")


def protocol(cfg: CHEConfig) -> dict:
    # Through JSON so it compares equal with what a runs.jsonl line gives back.
    return json.loads(json.dumps({k: getattr(cfg, k) for k in PROTOCOL_FIELDS}))


def _run_key(run: dict) -> tuple:
    return run["task"], run["method"], int(run["seed"])


def _from_json(run: dict) -> dict:
    # JSON turns the integer test lengths into strings; turn them back.
    return {**run, "per_length": {int(k): v for k, v in run["per_length"].items()}}


def read_runs(path: Path, repair: bool = False) -> list[dict]:
    """The runs in a runs.jsonl. A process killed mid-write leaves a partial last line: it is ignored,
    and with repair=True cut off the file so the next append starts on a fresh line."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    complete = data[:data.rfind(b"\n") + 1]  # everything up to the last newline
    if repair and len(complete) < len(data):
        with open(path, "r+b") as f:
            f.truncate(len(complete))
    runs = []
    for n, line in enumerate(complete.decode().splitlines(), 1):
        if line.strip():
            try:
                runs.append(_from_json(json.loads(line)))
            except (json.JSONDecodeError, KeyError) as e:  # a whole line that is broken is not a kill: say so
                raise CHEError(f"{path}:{n} is not a CHE run record ({e})") from e
    return runs


def _check_protocol(runs: list[dict], expected: dict, where: Path, hint: str):
    for run in runs:
        if run.get("protocol") != expected:
            diff = {k: (run.get("protocol", {}).get(k), expected.get(k)) for k in PROTOCOL_FIELDS
                    if run.get("protocol", {}).get(k) != expected.get(k)}
            raise CHEError(f"{where} holds a run ({run['task']}, {run['method']}, seed {run['seed']}) with a "
                           f"different protocol (field: (stored, wanted)) {diff}; {hint}")


def run_che(cfg: CHEConfig, out_dir: Path, progress: bool = True, memory_check: bool = True,
            force: bool = False) -> dict:
    """Every task x method x seed; writes che.json, che.md (table 6 layout) and che_per_length.png.
    memory_check: first refuse a method whose training or test does not fit the device's memory;
    unless force, first refuse a test far beyond the paper's (check_test_size).

    Each finished run is appended to out_dir/runs.jsonl at once, so a killed run_che started again with
    the same out_dir skips what is done (if it was run under the same protocol)."""
    for method in cfg.methods:  # reject unknown methods and impossible settings before any training
        try:
            Encoder(method, 2, 2, cfg)  # every layer built: a layout's too
        except UnknownMethodError:
            raise
        except ValueError as e:
            raise CHEError(f"{method}: {e}") from None
    for task in cfg.tasks:
        get_task(task)
    if not force:
        check_test_size(cfg)
    if memory_check:
        check_che_memory(cfg)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "runs.jsonl"
    proto = protocol(cfg)
    done = read_runs(log, repair=True)
    _check_protocol(done, proto, log, "use a fresh --out directory for a different protocol")
    by_key = {_run_key(r): r for r in done}
    commit = git_commit()
    todo = [(t, m, s) for t in cfg.tasks for m in cfg.methods for s in cfg.seeds if (t, m, s) not in by_key]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(todo) * cfg.steps, desc="che", unit="step", dynamic_ncols=True)
    for task, method, seed in todo:
        if bar is not None:
            bar.set_postfix(task=task, method=method, seed=seed)
        run = {**train_and_test(task, method, seed, cfg, bar.update if bar else None), "protocol": proto,
               "git_commit": commit}  # per run: a resumed CHE may span commits
        with open(log, "a") as f:  # one whole line per run, on disk before the next run starts
            f.write(json.dumps(run) + "\n")
            f.flush()
            os.fsync(f.fileno())
        by_key[(task, method, seed)] = run
    if bar is not None:
        bar.close()
    runs = [by_key[(t, m, s)] for t in cfg.tasks for m in cfg.methods for s in cfg.seeds]
    return _write_outputs({"config": asdict(cfg), "runs": runs, "summary": summarise(runs)}, cfg, out_dir)


def _write_outputs(result: dict, cfg: CHEConfig, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "che.json").write_text(json.dumps(result, indent=2))
    (out_dir / "che.md").write_text(to_markdown(che_table(result["summary"], cfg)))
    plot_per_length(result["runs"], out_dir / "che_per_length.png")
    return result


def _config_from_dict(config: dict) -> CHEConfig:
    known = {f.name for f in fields(CHEConfig)}  # tolerate keys a newer or older lenx wrote
    return CHEConfig(**{k: v for k, v in config.items() if k in known})


def _load_folder(folder: Path) -> list[dict]:
    """Runs of one CHE output folder: che.json and runs.jsonl together (the log may be ahead of che.json
    when a resumed run was killed), each run with its protocol."""
    folder = Path(folder)
    runs = []
    if (folder / "che.json").exists():
        saved = json.loads((folder / "che.json").read_text())
        proto = protocol(_config_from_dict(saved["config"]))  # che.json from before runs carried a protocol
        runs += [{"protocol": proto, **_from_json(r)} for r in saved["runs"]]
    runs += read_runs(folder / "runs.jsonl")
    if not runs:
        raise FileNotFoundError(f"{folder} holds no CHE results (no che.json or runs.jsonl)")
    return runs


def merge_che(sources: list[Path], out_dir: Path) -> dict:
    """Merge CHE output folders (say one per GPU process) into out_dir: che.json, che.md and
    che_per_length.png over the union of their runs. All runs must share one protocol."""
    out_dir = Path(out_dir)
    sources = [Path(s) for s in sources]
    if not sources:
        raise CHEError("merge_che needs at least one CHE output folder")
    if (out_dir / "runs.jsonl").exists() and out_dir.resolve() not in {s.resolve() for s in sources}:
        raise CHEError(f"{out_dir} holds a CHE run of its own; merge into another --out directory")
    by_key: dict = {}
    proto = None
    for source in sources:
        runs = _load_folder(source)
        proto = proto or runs[0]["protocol"]
        _check_protocol(runs, proto, source, "runs with different protocols cannot be merged")
        for run in runs:
            by_key.setdefault(_run_key(run), run)  # the same run in two places: keep the first
    runs = list(by_key.values())
    first_seen = lambda values: list(dict.fromkeys(values))  # noqa: E731
    cfg = CHEConfig(tasks=first_seen(r["task"] for r in runs), methods=first_seen(r["method"] for r in runs),
                    seeds=first_seen(int(r["seed"]) for r in runs), **proto)
    runs = [by_key[(t, m, s)] for t in cfg.tasks for m in cfg.methods for s in cfg.seeds if (t, m, s) in by_key]
    result = {"config": asdict(cfg), "merged_from": [str(s) for s in sources], "runs": runs,
              "summary": summarise(runs)}
    return _write_outputs(result, cfg, out_dir)


def redraw_che(che_json: Path, out_dir: Path | None = None) -> list[Path]:
    """Re-draw che.md and che_per_length.png from a saved che.json (no training); next to it by default."""
    che_json = Path(che_json)
    out_dir = Path(out_dir) if out_dir is not None else che_json.parent
    saved = json.loads(che_json.read_text())
    cfg = _config_from_dict(saved["config"])
    runs = [_from_json(r) for r in saved["runs"]]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "che.md").write_text(to_markdown(che_table(summarise(runs), cfg)))
    plot_per_length(runs, out_dir / "che_per_length.png")
    return [out_dir / "che.md", out_dir / "che_per_length.png"]


def summarise(runs: list[dict]) -> dict:
    """{task: {method: {mean, std, max, seeds}}} of the per-seed average accuracies; std is the sample
    std (n - 1, 0 for one seed), as in every other table of lenx."""
    out: dict = {}
    for r in runs:
        out.setdefault(r["task"], {}).setdefault(r["method"], []).append(r["accuracy"])
    return {t: {m: {"mean": float(np.mean(a)), "std": float(np.std(a, ddof=1)) if len(a) > 1 else 0.0, "max": float(np.max(a)), "seeds": len(a)}
                for m, a in ms.items()} for t, ms in out.items()}


def plot_per_length(runs: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in runs}, key=list(TASKS).index)
    cols = min(3, len(tasks))
    rows = math.ceil(len(tasks) / cols)
    # constrained layout makes room for the title above the panels
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows + 0.4), squeeze=False, layout="constrained")
    for ax, task in zip(axes.flat, tasks):
        by_method: dict = {}
        for r in runs:
            if r["task"] == task:
                by_method.setdefault(r["method"], []).append(r["per_length"])
        for method, curves in by_method.items():
            lengths = sorted(int(L) for L in curves[0])
            mean = [np.mean([c[L] if L in c else c[str(L)] for c in curves]) for L in lengths]
            ax.plot(lengths, mean, label=method)
        ax.axhline(get_task(task).chance, color="grey", ls=":", lw=1)
        ax.set_title(task)
        ax.set_xlabel("test length")
        ax.set_ylabel("accuracy")
        ax.set_ylim(0, 1.02)
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    train_max = runs[0].get("protocol", {}).get("train_max_length", CHEConfig.train_max_length)
    # two short lines: one panel is only 5 inches wide
    fig.suptitle(f"CHE: accuracy per test length\ntrained on lengths 1..{train_max}; dotted: chance")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def make_config(preset: str = "smoke", **overrides) -> CHEConfig:
    if preset not in PRESETS:
        raise CHEError(f"unknown CHE preset {preset!r}; choose one of {', '.join(PRESETS)}")
    cfg = replace(CHEConfig(), **PRESETS[preset])
    cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    if min(cfg.train_max_length, cfg.test_min_length, cfg.steps, cfg.test_samples, cfg.batch_size,
           cfg.test_length_step) < 1:
        raise CHEError("CHE lengths, test length step, steps, batch size and test samples must all be >= 1")
    if cfg.test_max_length < cfg.test_min_length:
        raise CHEError(f"test_max_length {cfg.test_max_length} < test_min_length {cfg.test_min_length}")
    if not (cfg.tasks and cfg.methods and cfg.seeds):
        raise CHEError("CHE needs at least one task, one method and one seed")
    if min(cfg.seeds) < 0:
        raise CHEError(f"CHE seeds must be >= 0, got {cfg.seeds}")
    for option, names in (("--tasks", cfg.tasks), ("--methods", cfg.methods)):  # each would train twice
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise CHEError(f"{option} names {', '.join(twice)} more than once")
    return cfg
