"""Per-layer layouts (model.layers): each layer's method and window, and the named presets of the
hybrids published models use.

A layout is a comma-separated list of entries ``method[:wW]`` (W: the window, each query sees its W
most recent keys; no window: global attention), with ``N*(...)`` (or ``N*entry``) for repeats and
``(...)`` for a group: ``rope:w4096,rope:w4096,rope:w4096,nope`` is ``3*(rope:w4096),nope``. A pattern shorter than the
model repeats to n_layer, so its length must divide n_layer. Every method takes a window: a window
masks keys as the causal edge does, and every part reads masked keys as it reads keys past that edge.
"""

from dataclasses import dataclass, replace
import difflib
import re

from .methods import parse_method


class LayoutError(ValueError):
    """A layout that cannot be read; one line naming the layer or the character."""


@dataclass(frozen=True)
class LayerSpec:
    method: str  # the canonical name (methods.parse_method)
    window: int = 0  # 0: global


@dataclass(frozen=True)
class Preset:
    layers: str
    description: str


PRESETS = {
    "rnope-swa": Preset(
        "3*(rope:w4096),nope",
        "RNoPE-SWA (Yang et al. 2025, Cohere Command R7B/A): 3 RoPE layers with a sliding window of 4096 (Command "
        "R7B's sliding_window, transformers' cohere2), then 1 global NoPE layer"),
    "irope": Preset(
        "3*(rope:w8192),nope",
        "iRoPE as in Llama 4: 3 local RoPE layers, then 1 global NoPE layer; Llama 4's local layers attend within "
        "chunks of 8192 tokens (attention_chunk_size), approximated here by a sliding window of 8192; its NoPE "
        "temperature tuning is left out"),
    "smollm3": Preset("3*(rope),nope", "SmolLM3 (no_rope_layers): NoPE in every 4th layer, RoPE elsewhere, all global"),
}

_ENTRY = re.compile(r"([a-z0-9-]+)(?::w(\d+))?")
MAX_PATTERN = 1 << 16
_TOKEN = re.compile(r"[^,()]+")
_REPEAT = re.compile(r"(\d+)\*")


def parse_layout(text: str, n_layer: int) -> list[LayerSpec]:
    """The LayerSpec of each of n_layer layers of a layout or preset name; a one-line LayoutError
    names the first bad layer (or where the text stops making sense)."""
    source = "".join(text.split()).lower()
    if source in PRESETS:
        source = PRESETS[source].layers
    if not source:
        raise LayoutError("model.layers is empty: name a preset or list the layers' methods")
    try:
        entries, end = _items(source, 0)
        if end != len(source):
            raise LayoutError(f"unexpected {source[end]!r} at character {end + 1}")
    except LayoutError as e:
        raise LayoutError(f"model.layers {source!r}: {e}") from None
    specs = []
    for i, entry in enumerate(entries):
        match = _ENTRY.fullmatch(entry)
        if not match:
            raise LayoutError(f"model.layers: layer {i} ({entry}): an entry reads method or method:wW (W a number "
                              "of keys)")
        name, window = match.groups()
        try:
            method = parse_method(name).name
        except ValueError as e:
            hint = difflib.get_close_matches(name, list(PRESETS), n=1) if "," not in source else []
            more = f" ({hint[0]!r} is a preset: give it alone)" if hint else ""
            raise LayoutError(f"model.layers: layer {i} ({entry}): {e}{more}") from None
        if window is not None and int(window) < 1:
            raise LayoutError(f"model.layers: layer {i} ({entry}): a window must be >= 1 (leave :wW out for a "
                              "global layer)")
        specs.append(LayerSpec(method, int(window or 0)))
    if n_layer % len(entries):
        raise LayoutError(f"model.layers {text!r} has a pattern of {len(entries)} layers, which does not divide "
                          f"model.n_layer = {n_layer}")
    return specs * (n_layer // len(entries))


def _items(s: str, at: int, depth: int = 0) -> tuple[list[str], int]:
    """The entries (expanded, as text) of the comma-separated items from s[at:], and where they end
    (at a ")" or the end)."""
    if depth > 16:
        raise LayoutError(f"parentheses nested more than 16 deep at character {at + 1}")
    out = []
    while True:
        repeat = _REPEAT.match(s, at)
        n = int(repeat.group(1)) if repeat else 1
        if n < 1:
            raise LayoutError(f"a repeat count must be >= 1, got {n} at character {at + 1}")
        at = repeat.end() if repeat else at
        if s.startswith("(", at):  # N*(...), or a bare group (...)
            inner, end = _items(s, at + 1, depth + 1)
            if not s.startswith(")", end):
                raise LayoutError(f"'(' at character {at + 1} is never closed")
            at = end + 1
        else:
            inner, at = _entry(s, at)
        if n * len(inner) > MAX_PATTERN:  # before the list is made: 10**9*rope must not take the memory
            raise LayoutError(f"{n}*(...) makes a pattern of more than {MAX_PATTERN} layers")
        out += inner * n
        if not s.startswith(",", at):
            return out, at
        at += 1


def _entry(s: str, at: int) -> tuple[list[str], int]:
    m = _TOKEN.match(s, at)
    if not m:
        got = f"{s[at]!r}" if at < len(s) else "the end"
        raise LayoutError(f"expected method[:wW] or N*(...) at character {at + 1}, got {got}")
    return [m.group(0)], m.end()


def layer_configs(cfg, layers: str, n_layer: int) -> list:
    """One attention config per layer: `cfg` with each layer's method and window (`layers` empty:
    `cfg` in every layer). A windowed layer is causal (its W most recent keys), in CHE's encoder too."""
    if not layers.strip():
        return [cfg] * n_layer
    return [replace(cfg, method=s.method, window=s.window, causal=cfg.causal or s.window > 0)
            for s in parse_layout(layers, n_layer)]


def method_or_layout(name: str) -> tuple[str, str]:
    """(method, layers) of a name that is a method, or a layout (a preset, or entries with windows,
    repeats or several layers: its layers' methods replace the method, "nope")."""
    layout = name.strip().lower() in PRESETS or any(c in name for c in ",:*(")
    return ("nope", name) if layout else (name, "")


def layer_methods(method: str, layers: str, n_layer: int) -> list[str]:
    """Each layer's method."""
    return [s.method for s in parse_layout(layers, n_layer)] if layers.strip() else [method] * n_layer
