"""The attention maps of one input to a trained run: raw scores, bias and processed scores of one
head (attention_maps), saved as JSON (save_attention_maps, save_run_attention) that `lenx plot
--attention` draws."""

import json
import math
from pathlib import Path

import torch

from ..attention.backends import score_block
from ..attention.layouts import layer_methods
from ..attention.methods import BASES, parse_method
from ..config import ConfigError
from ..fileio import check_writable_dir
from ..model import check_device
from ..model.memory import GB, available_memory, estimate_memory
from ..runs import load_model, open_run_corpus, run_config, run_weights


# What --attention writes grows as T^2: each map's entries take about 11 bytes of JSON (9 significant
# digits and a separator; null above the diagonal), measured. Above MAX_JSON_BYTES it needs --force.
JSON_BYTES_PER_ENTRY = 11
MAX_JSON_BYTES = 100 * 10 ** 6


def map_names(method: str) -> list[str]:
    """The maps attention_maps draws for a method: the scores, its bias, its processed scores."""
    spec = parse_method(method)
    processed = spec.processor is not None or BASES[spec.base].role == "processor"
    return ["scores"] + (["bias"] if spec.bias is not None else []) + (["processed"] if processed else [])


def check_json_size(method: str, length: int, force: bool = False) -> None:
    """A one-line ConfigError, unless `force`, when the maps of `length` tokens would write more than
    MAX_JSON_BYTES of JSON: it names the size and the longest length under the bound."""
    names = map_names(method)
    size = len(names) * length ** 2 * JSON_BYTES_PER_ENTRY
    if size <= MAX_JSON_BYTES or force:
        return
    longest = math.isqrt(MAX_JSON_BYTES // (len(names) * JSON_BYTES_PER_ENTRY))
    shown = f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{size / 1e3:.0f} KB"
    raise ConfigError(f"--length {length} would write about {shown} of JSON ({len(names)} map"
                      f"{'s' if len(names) > 1 else ''} of {length} x {length}: {', '.join(names)}); up to --length "
                      f"{longest} it stays under {MAX_JSON_BYTES / 1e6:.0f} MB; pass --force to write it anyway")


def check_maps_memory(m, length: int) -> None:
    """A one-line ConfigError when the maps of `length` tokens cannot fit in the CPU's memory (--force
    lifts the JSON bound, not this): the model's forward, the score block's maps of every head (fp32)
    and one map as Python floats on its way to JSON (about 64 bytes an entry)."""
    cpu = torch.device("cpu")
    have = available_memory(cpu)
    forward = estimate_memory(m, 1, length, cpu, training=False).total
    names = max(len(map_names(method)) for method in layer_methods(m.method, m.layers, m.n_layer))
    maps = names * m.n_head * length ** 2 * 4 + length ** 2 * 64
    if have is not None and forward + maps > have:
        raise ConfigError(f"--attention at --length {length} needs about {(forward + maps) / GB:.1f} GB (the forward "
                          f"{forward / GB:.2f} GB, the maps and their JSON {maps / GB:.1f} GB) but the CPU has "
                          f"{have / GB:.1f} GB available; lower --length")


def attention_maps(run_dir: Path, tokens: torch.Tensor | None = None, layer: int = 0, head: int = 0,
                   length: int = 64) -> dict:
    """Raw scores, bias and processed scores (pre-softmax, the part a row sees; NaN above the diagonal
    and left of a window) of
    one head of a trained run for one input, with "method", "layer", "head" and "length". The input
    is `tokens`, by default the first `length` tokens of the run's test split. Runs on the CPU."""
    cfg = run_config(run_dir)
    corpus = open_run_corpus(run_dir, cfg) if tokens is None else None
    model = load_model(cfg, run_weights(run_dir), torch.device("cpu"))
    if tokens is None:
        tokens = torch.from_numpy(corpus.tokens("test")[:length].astype("int64"))
    attn = model.blocks[layer].attn
    captured = {}
    handle = attn.register_forward_pre_hook(lambda mod, args: captured.setdefault("x", args[0]))
    with torch.no_grad():
        model.hidden(tokens[None])
        handle.remove()
        q, k, _ = attn.project(captured["x"])
        raw, bias, processed = score_block(q, k, attn.parts_for(captured["x"])[0])  # FoX's bias reads x
        maps = {"scores": raw[0, head]}
        if bias is not None:
            maps["bias"] = bias.expand_as(raw)[0, head]
        if attn.processor is not None:
            maps["processed"] = processed[0, head]
    T = len(tokens)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    if attn.parts.window:  # keys left of the window are masked as those past the diagonal
        mask |= torch.ones(T, T, dtype=torch.bool).tril(-attn.parts.window)
    return {name: m.masked_fill(mask, float("nan")) for name, m in maps.items()} | {
        "method": attn.spec.name, "layer": layer, "head": head, "length": T}  # the layer's (model.layers)


def save_attention_maps(maps: dict, path: Path) -> Path:
    """attention_maps() as JSON: each map a nested list with NaN (the masked upper triangle) as null."""
    data = {}
    for name, value in maps.items():
        if isinstance(value, torch.Tensor):
            # 9 significant digits give back the same float32 and keep the file about half the size
            data[name] = [[None if math.isnan(v) else float(f"{v:.9g}") for v in row] for row in value.tolist()]
        else:
            data[name] = value
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def save_run_attention(run_dir: Path, out_dir: Path | None = None, layer: int = 0, head: int = 0,
                       length: int = 64, force: bool = False) -> tuple[Path, Path]:
    """The attention maps of one head of a run for one input (attention_maps), computed on the CPU
    and saved as JSON into out_dir (default: the run folder), after checking the layer, head and
    length against the run's model, and the size of the JSON (check_json_size; `force` lifts the
    bound): (the JSON file, the figure to draw from it). The checkpoint is read once, into JSON;
    `lenx plot` draws the figure from that file, as it re-draws it later."""
    cfg = run_config(run_dir)
    m = cfg.model
    for option, value, count, what in (("--layer", layer, m.n_layer, "layers"), ("--head", head, m.n_head, "heads")):
        if not 0 <= value < count:
            raise ConfigError(f"{option} {value} does not exist: the model of {run_dir} has {count} {what} "
                              f"({option} 0 to {count - 1})")
    if length < 1:
        raise ConfigError(f"--length must be >= 1, got {length}")
    check_json_size(layer_methods(m.method, m.layers, m.n_layer)[layer], length, force)
    check_maps_memory(m, length)
    check_device(cfg, "cpu", training=False)
    if out_dir is None:
        check_writable_dir(run_dir, "the run folder")
    png = Path(out_dir or run_dir) / f"attention_L{layer}_H{head}.png"
    maps = attention_maps(run_dir, layer=layer, head=head, length=length)
    return save_attention_maps(maps, png.with_suffix(".json")), png
