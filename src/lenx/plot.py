"""Figures drawn only from files on disk (results.json / eval.json / run checkpoints), so any
result can be re-plotted without re-running."""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


def _series(results: list[dict], key: str):
    for r in results:
        xs = [int(L) for L in r["results"] if key in r["results"][L]]
        yield r, xs, [r["results"][str(L)][key] for L in xs]


def _mark_train_len(ax, results):
    for T in sorted({r["train_len"] for r in results}):
        ax.axvline(T, color="grey", ls="--", lw=1)
        ax.text(T, ax.get_ylim()[1], f" train {T}", va="top", ha="left", fontsize=8, color="grey")


def plot_perplexity(results: list[dict], out: Path, title: str | None = None) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r, xs, ys in _series(results, "ppl"):
        ax.plot(xs, ys, marker="o", label=r["method"])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel(f"perplexity of the last {results[0]['scored']} tokens")
    ax.set_title(title or f"Length extrapolation ({results[0]['corpus']})")
    _mark_train_len(ax, results)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)


def plot_delta_p(results: list[dict], out: Path, title: str | None = None) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r, xs, ys in _series(results, "delta_p"):
        ax.plot(xs, ys, marker="o", label=r["method"])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel(f"ΔP (ppl of last {results[0]['delta_p_tokens']} tokens: short − full context)")
    ax.set_title(title or "ΔP > 0: the model gains from context beyond its training length")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)


def attention_maps(run_dir: Path, tokens: torch.Tensor, layer: int = 0, head: int = 0) -> dict:
    """Raw scores, bias and processed scores (pre-softmax, causal part) of one head for one input."""
    from .attention.backends import score_block
    from .evaluate import load_run

    model, cfg = load_run(run_dir, torch.device("cpu"))
    attn = model.blocks[layer].attn
    captured = {}
    handle = attn.register_forward_pre_hook(lambda mod, args: captured.setdefault("x", args[0]))
    with torch.no_grad():
        model.hidden(tokens[None])
        handle.remove()
        q, k, _ = attn.project(captured["x"])
        raw, bias, processed = score_block(q, k, attn.parts)
        maps = {"scores": raw[0, head]}
        if bias is not None:
            maps["bias"] = bias.expand_as(raw)[0, head]
        if attn.processor is not None:
            maps["processed"] = processed[0, head]
    T = len(tokens)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    return {name: m.masked_fill(mask, float("nan")) for name, m in maps.items()} | {"method": cfg.model.method}


def plot_attention_maps(run_dir: Path, tokens: torch.Tensor, out: Path, layer: int = 0, head: int = 0) -> Path:
    maps = attention_maps(run_dir, tokens, layer, head)
    method = maps.pop("method")
    titles = {"scores": "raw scores QKᵀ/√d", "bias": "position bias", "processed": "after the score processor"}
    fig, axes = plt.subplots(1, len(maps), figsize=(4.2 * len(maps), 4), squeeze=False)
    for ax, (name, m) in zip(axes[0], maps.items()):
        im = ax.imshow(m.numpy(), cmap="viridis", interpolation="nearest")
        ax.set_title(titles[name])
        ax.set_xlabel("key position j")
        ax.set_ylabel("query position i")
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(f"{method}: layer {layer}, head {head}, one input of {len(tokens)} tokens")
    return _save(fig, out)


def _save(fig, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def load_results(path: Path) -> list[dict]:
    """A sweep's results.json (a list of eval results) or a single run's eval.json."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json" if (path / "results.json").exists() else path / "eval.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass a sweep directory, its results.json, or a run's eval.json")
    data = json.loads(path.read_text())
    return data["runs"] if isinstance(data, dict) and "runs" in data else [data] if isinstance(data, dict) else data
