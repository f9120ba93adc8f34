"""The CHE length-generalisation protocol (Deletang et al. 2023, as set up by Ruoss et al. 2023).

An encoder (non-causal) transformer, 5 layers, d 64, 8 heads, FFN x4 with ReLU, dropout 0.1, with any
lenx attention method in its bidirectional form, reads the task's input followed by |y| blank
positions and predicts the output from those positions. Training lengths are uniform in 1..40; the
test covers every length 41..500 with 512 samples each; the score is the masked per-token argmax
accuracy (up to the terminator for the padded tasks) averaged over the test lengths.

How each method is made bidirectional: ALiBi, Kerple and FIRE use |i - j| (FIRE normalises by
max(i, j)); T5 gives each direction its own 16 buckets; Transformer-XL uses signed distances; RoPE
and NoPE need no change; DAPE / DAPE V2 see the whole score map (no tril). CoPE and stick-breaking
are directional by construction and are rejected.
"""

from dataclasses import asdict, dataclass, field, replace
import json
import math
from pathlib import Path
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .model import Block, LMConfig
from .tasks import TASKS, get_task


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


class Encoder(nn.Module):
    """Token + blank embedding, non-causal lenx blocks, a classification head per position."""

    def __init__(self, method: str, vocab: int, classes: int, cfg: CHEConfig):
        super().__init__()
        block_cfg = LMConfig(method=method, causal=False, n_layer=cfg.n_layer, n_head=cfg.n_head, d_model=cfg.d_model,
                             activation="relu", dropout=cfg.dropout)
        shared: dict = {}
        self.embed = nn.Embedding(vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(block_cfg, shared) for _ in range(cfg.n_layer))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, classes)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def train_and_test(task_name: str, method: str, seed: int, cfg: CHEConfig, progress=None) -> dict:
    """Train one model on one task with one seed; return per-length test accuracy."""
    task = get_task(task_name)
    device = _device(cfg.device)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = Encoder(method, task.input_vocab + 1, task.output_vocab, cfg).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    t0 = time.perf_counter()
    model.train()
    for step in range(cfg.steps):
        length = int(rng.integers(1, cfg.train_max_length + 1))
        x, y, mask = (t.to(device) for t in task.sample(cfg.batch_size, length, rng))
        with amp:
            logits = model(x)
        loss = F.cross_entropy(logits[mask].float(), y[mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if progress is not None:
            progress(1)
    train_time = time.perf_counter() - t0

    model.eval()
    test_rng = np.random.default_rng(10_000 + seed)  # the same test set for every method
    per_length = {}
    lengths = range(cfg.test_min_length, cfg.test_max_length + 1, cfg.test_length_step)
    for length in lengths:
        correct = total = 0
        for start in range(0, cfg.test_samples, 128):
            n = min(128, cfg.test_samples - start)
            x, y, mask = (t.to(device) for t in task.sample(n, length, test_rng))
            with torch.no_grad(), amp:
                pred = model(x).argmax(-1)
            scored = task.accuracy_mask(y, mask)
            correct += int(((pred == y) & scored).sum())
            total += int(scored.sum())
        per_length[length] = correct / total
    return {"task": task_name, "method": method, "seed": seed, "final_train_loss": float(loss.detach()),
            "accuracy": float(np.mean(list(per_length.values()))), "per_length": per_length,
            "train_time_s": train_time}


def run_che(cfg: CHEConfig, out_dir: Path, progress: bool = True) -> dict:
    """Every task x method x seed; writes che.json, che.md (table 6 layout) and che_per_length.png."""
    from .attention import Attention, AttentionConfig

    for method in cfg.methods:  # reject unknown or directional methods before any training
        Attention(AttentionConfig(method=method, causal=False), cfg.n_head, cfg.d_model)
    for task in cfg.tasks:
        get_task(task)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(cfg.tasks) * len(cfg.methods) * len(cfg.seeds) * cfg.steps, desc="che", unit="step",
                   dynamic_ncols=True)
    runs = []
    for task in cfg.tasks:
        for method in cfg.methods:
            for seed in cfg.seeds:
                if bar is not None:
                    bar.set_postfix(task=task, method=method, seed=seed)
                runs.append(train_and_test(task, method, seed, cfg, bar.update if bar else None))
    if bar is not None:
        bar.close()
    summary = summarise(runs)
    result = {"config": asdict(cfg), "runs": runs, "summary": summary}
    (out_dir / "che.json").write_text(json.dumps(result, indent=2))
    (out_dir / "che.md").write_text(che_table(summary, cfg))
    plot_per_length(runs, out_dir / "che_per_length.png")
    return result


def summarise(runs: list[dict]) -> dict:
    """{task: {method: {mean, std, max, seeds}}} of the per-seed average accuracies."""
    out: dict = {}
    for r in runs:
        out.setdefault(r["task"], {}).setdefault(r["method"], []).append(r["accuracy"])
    return {t: {m: {"mean": float(np.mean(a)), "std": float(np.std(a)), "max": float(np.max(a)), "seeds": len(a)}
                for m, a in ms.items()} for t, ms in out.items()}


def che_table(summary: dict, cfg: CHEConfig) -> str:
    """Markdown table like the paper's table 6: tasks x methods, accuracy in %, max over seeds (mean ± std)."""
    lines = [f"CHE accuracy (%), test lengths {cfg.test_min_length}..{cfg.test_max_length}, "
             f"{cfg.steps} steps, seeds {cfg.seeds}: max over seeds (mean ± std).", "",
             "| level | task | chance | " + " | ".join(cfg.methods) + " |",
             "|---|---|---|" + "---|" * len(cfg.methods)]
    for task in cfg.tasks:
        t = get_task(task)
        cells = []
        for m in cfg.methods:
            s = summary[task][m]
            cells.append(f"{100 * s['max']:.1f} ({100 * s['mean']:.1f} ± {100 * s['std']:.1f})")
        lines.append(f"| {t.level} | {task} | {100 * t.chance:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_per_length(runs: list[dict], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in runs}, key=list(TASKS).index)
    cols = min(3, len(tasks))
    rows = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
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
    fig.suptitle("CHE: accuracy per test length (trained on lengths 1..40; dotted: chance)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def make_config(preset: str = "smoke", **overrides) -> CHEConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown CHE preset {preset!r}; choose one of {', '.join(PRESETS)}")
    cfg = replace(CHEConfig(), **PRESETS[preset])
    cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    if min(cfg.train_max_length, cfg.test_min_length, cfg.steps, cfg.test_samples, cfg.batch_size) < 1:
        raise ValueError("CHE lengths, steps, batch size and test samples must all be >= 1")
    if cfg.test_max_length < cfg.test_min_length:
        raise ValueError(f"test_max_length {cfg.test_max_length} < test_min_length {cfg.test_min_length}")
    return cfg
