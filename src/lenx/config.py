"""Run configuration: dataclasses, TOML presets and dotted command-line overrides.

A run is configured by one TOML file with the sections [model], [train], [data] and [eval], then
`--set section.key=value` overrides (values parse as TOML: `train.lr=3e-4`, `model.method=kerple`,
`eval.lengths=[128,256]`). Unknown sections and keys are errors that suggest the nearest name.
"""

from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
import difflib
import math
from pathlib import Path
import re
import typing

import torch

from .model import LM, LMConfig

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as the tomli package (a dependency there)
    import tomli as tomllib

PRESET_DIR = Path(__file__).parent / "configs"


class ConfigError(ValueError):
    pass


@dataclass
class DataConfig:
    corpus: str = "synthetic"  # a prepared corpus under root (`lenx prepare NAME`)
    root: str = "data"


@dataclass
class TrainConfig:
    seq_len: int = 128
    batch_size: int = 32  # sequences per optimizer step (the global batch)
    grad_accum: int = 1  # micro-batches per step (batch_size must divide by it)
    steps: int = 1000
    lr: float = 6e-4
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_frac: float = 0.01
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | bf16 | fp32
    compile: bool = False
    ckpt_every: int = 200
    log_every: int = 10
    parallel: str = "ddp"  # ddp | fsdp (only used under torchrun)
    val_every: int = 0  # validation loss every N steps; 0 = off
    val_batches: int = 8  # batches of the val split per validation
    keep_every: int = 0  # keep the weights of every Nth step besides the last checkpoint; 0 = off
    init_from: str = ""  # a trained run whose weights start this one (fine-tuning, e.g. with a scaled RoPE)


@dataclass
class EvalConfig:
    lengths: list[int] = field(default_factory=list)  # empty: powers of two from seq_len to max_length
    max_length: int = 8192
    windows: int = 64  # evaluation windows per length, the same for every method
    scored: int = 256  # perplexity of the last `scored` tokens (the paper's protocol)
    split: str = "test"
    seed: int = 1234
    token_budget: int = 0  # tokens per forward batch; 0 = automatic


@dataclass
class RunConfig:
    model: LMConfig = field(default_factory=LMConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def resolve_config_path(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    preset = PRESET_DIR / f"{name_or_path}.toml"
    if preset.is_file():
        return preset
    hint = difflib.get_close_matches(str(name_or_path), presets(), n=1)
    raise ConfigError(
        f"no config file or preset {str(name_or_path)!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
        + f" Presets: {', '.join(presets())}"
    )


def _coerce(value, hint, where: str):
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return [_coerce(v, item, where) for v in value]
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    raise AssertionError(hint)


def _set(obj, key: str, value, where: str):
    hints = typing.get_type_hints(type(obj))
    names = [f.name for f in fields(obj)]
    if key not in names:
        close = difflib.get_close_matches(key, names, n=1)
        raise ConfigError(f"unknown config key {where!r}" + (f"; did you mean {where.rsplit('.', 1)[0]}.{close[0]}?" if close else "")
                          + f" Valid keys: {', '.join(names)}")
    setattr(obj, key, _coerce(value, hints[key], where))


def apply_dict(cfg: RunConfig, data: dict, prefix: str = "") -> RunConfig:
    sections = [f.name for f in fields(cfg)]
    for section, values in data.items():
        if section not in sections:
            close = difflib.get_close_matches(section, sections, n=1)
            raise ConfigError(f"unknown config section {section!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                              + f" Sections: {', '.join(sections)}")
        if not isinstance(values, dict):
            raise ConfigError(f"[{section}] must be a table of keys")
        target = getattr(cfg, section)
        for key, value in values.items():
            _set(target, key, value, f"{section}.{key}")
    return cfg


def parse_override(text: str) -> tuple[str, str, object]:
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"override {text!r} must look like section.key=value (e.g. train.lr=3e-4)")
    key, raw = text.split("=", 1)
    section, name = key.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word such as model.method=dapev2-kerple
    return section, name, value


def load_config(name_or_path: str | Path | None = None, overrides: list[str] | tuple = ()) -> RunConfig:
    cfg = RunConfig()
    if name_or_path is not None:
        path = resolve_config_path(name_or_path)
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML ({e})") from None
        apply_dict(cfg, data)
    for text in overrides:
        section, name, value = parse_override(text)
        apply_dict(cfg, {section: {name: value}})
    validate(cfg)
    return cfg


# What eval.split may name: the splits every prepared corpus has (lenx.data.corpus.SPLITS).
SPLITS = ("train", "val", "test")


def validate(cfg: RunConfig) -> None:
    """Check every field's range or choices, then build the model on the meta device (no memory and
    no time, even for 350m) so that what a run builds is known to build. Raises a one-line
    ConfigError that names the key. What depends on the machine is check_device's."""
    _validate_model(cfg.model)
    _validate_train(cfg.train)
    _validate_eval(cfg.eval)
    _check(cfg.data.corpus.strip() != "", "data.corpus", "a corpus name", cfg.data.corpus)
    _check(cfg.data.root.strip() != "", "data.root", "a folder", cfg.data.root)
    try:
        model = _build_meta(replace(cfg.model, backend="auto"))
    except (ValueError, AssertionError) as e:
        raise ConfigError(f"model: {cfg.model.method} cannot be built with these settings: {e}") from None
    if cfg.model.backend != "auto":
        # judged where the backend runs at all (triton: CUDA); check_device judges the device in use
        _check_backend(model, cfg.model.backend, torch.device("cuda" if cfg.model.backend == "triton" else "cpu"))


def check_device(cfg: RunConfig, device: str, key: str = "train.device", training: bool = True) -> torch.device:
    """What validate() cannot know: `device` (auto, cpu, cuda or cuda:N; `key` names where it was
    given) exists on this machine, and the forced attention backend runs on it, and trains on it when
    `training`. Returns the device."""
    from .attention.backends import get_backend

    dev = resolve_device(device, key)
    backend = cfg.model.backend
    if backend != "auto":
        # every layer has the same parts: one layer answers for all
        _check_backend(_build_meta(replace(cfg.model, n_layer=1, backend="auto")), backend, dev)
        if training and not get_backend(backend).trains(dev):
            raise ConfigError(f"model.backend={backend} cannot train on {dev.type} (it has no backward there); "
                              "use model.backend=chunked or auto")
    return dev


def _check(ok: bool, key: str, rule: str, value) -> None:
    if not ok:
        raise ConfigError(f"{key} must be {rule}, got {value!r}")


def _at_least(section: str, obj, low: int, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        _check(value >= low, f"{section}.{name}", f">= {low}", value)


def _one_of(key: str, value, choices) -> None:
    _check(value in choices, key, "one of " + ", ".join(choices), value)


def _positive(key: str, value: float) -> None:
    _check(math.isfinite(value) and value > 0, key, "a positive number", value)


def _fraction(key: str, value: float, top_open: bool = False) -> None:
    ok = 0 <= value < 1 if top_open else 0 <= value <= 1
    _check(ok, key, "in [0, 1)" if top_open else "in [0, 1]", value)


def _validate_model(m: LMConfig) -> None:
    from .attention.backends import BACKENDS
    from .attention.methods import parse_method
    from .attention.rope import SCALINGS
    from .attention.stickbreaking import REMAINDER_MODES

    try:
        parse_method(m.method)
    except ValueError as e:
        raise ConfigError(f"model.method: {e}") from None
    _at_least("model", m, 1, "vocab_size", "n_layer", "n_head", "d_model", "mlp_ratio", "chunk_size",
              "dape_hidden", "fire_width", "cope_npos")
    if m.d_model % m.n_head:
        raise ConfigError(f"model.d_model ({m.d_model}) must be divisible by model.n_head ({m.n_head})")
    _check(m.dape_kernel % 2 == 1 and m.dape_kernel >= 1, "model.dape_kernel",
           "an odd integer >= 1 (the 1xk kernel is centred on each key)", m.dape_kernel)
    _check(m.t5_buckets >= 2, "model.t5_buckets", ">= 2", m.t5_buckets)
    _check(m.t5_max_distance > m.t5_buckets // 2, "model.t5_max_distance",
           f"above the exact buckets (model.t5_buckets // 2 = {m.t5_buckets // 2})", m.t5_max_distance)
    _positive("model.rope_base", m.rope_base)
    _positive("model.fire_L_init", m.fire_L_init)
    _fraction("model.dropout", m.dropout, top_open=True)
    _one_of("model.backend", m.backend, ("auto", *BACKENDS))
    _one_of("model.activation", m.activation, ("gelu", "relu"))
    _one_of("model.fire_activation", m.fire_activation, ("auto", "relu", "leaky_relu"))
    _one_of("model.sb_remainder", m.sb_remainder, REMAINDER_MODES)
    _one_of("model.rope_scaling", m.rope_scaling, SCALINGS)
    _check(m.rope_scaling_factor == 0 or m.rope_scaling_factor >= 1, "model.rope_scaling_factor",
           "0 (auto: the length processed / model.rope_train_len) or a number >= 1", m.rope_scaling_factor)
    _at_least("model", m, 0, "rope_train_len")
    _check(m.rope_scaling == "none" or m.rope_train_len >= 1, "model.rope_train_len",
           f">= 1 with model.rope_scaling={m.rope_scaling} (the training length the scaling extends)", m.rope_train_len)
    _check(m.causal, "model.causal", "true (an LM that sees the tokens it predicts learns nothing; "
           "bidirectional encoders are `lenx che`)", m.causal)


def _validate_train(t: TrainConfig) -> None:
    _at_least("train", t, 1, "seq_len", "batch_size", "grad_accum", "steps", "ckpt_every", "log_every",
              "val_batches")
    _at_least("train", t, 0, "seed", "val_every", "keep_every")
    if t.batch_size % t.grad_accum:
        raise ConfigError(f"train.batch_size ({t.batch_size}) must be divisible by train.grad_accum ({t.grad_accum})")
    _positive("train.lr", t.lr)
    _positive("train.grad_clip", t.grad_clip)
    _fraction("train.min_lr_ratio", t.min_lr_ratio)
    _fraction("train.warmup_frac", t.warmup_frac)
    _fraction("train.beta1", t.beta1, top_open=True)
    _fraction("train.beta2", t.beta2, top_open=True)
    _check(math.isfinite(t.weight_decay) and t.weight_decay >= 0, "train.weight_decay", ">= 0", t.weight_decay)
    _check_device_name(t.device, "train.device")
    _one_of("train.precision", t.precision, ("auto", "bf16", "fp32"))
    _one_of("train.parallel", t.parallel, ("ddp", "fsdp"))


def _validate_eval(e: EvalConfig) -> None:
    _at_least("eval", e, 1, "max_length", "windows", "scored")
    _at_least("eval", e, 0, "seed", "token_budget")
    _check(all(L >= 1 for L in e.lengths), "eval.lengths", "lengths >= 1", e.lengths)
    _one_of("eval.split", e.split, SPLITS)


def _check_device_name(name: str, key: str) -> None:
    _check(name in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", name) is not None, key,
           "auto, cpu, cuda or cuda:N", name)


def resolve_device(name: str, key: str = "train.device") -> torch.device:
    """auto (CUDA when there is one), cpu, cuda or cuda:N, checked against this machine; a one-line
    ConfigError names `key` otherwise."""
    _check_device_name(name, key)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{key} is {name} but no CUDA device is visible; use cpu or auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"{key} is {name} but only {torch.cuda.device_count()} CUDA device(s) are visible")
    return dev


def _build_meta(model_cfg: LMConfig) -> LM:
    """The LM of model_cfg, its weights on the meta device (they take no memory)."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # building must not move the caller's random state
        return LM(model_cfg)


def _check_backend(model: LM, backend: str, device: torch.device) -> None:
    from .attention.backends import plan_backend

    try:
        plan_backend(model.blocks[0].attn.parts, device, backend)
    except ValueError as e:
        raise ConfigError(f"model.backend={backend} (model.method={model.cfg.method}) on {device.type}: {e}") from None


def to_toml(obj) -> str:
    """Serialise a RunConfig (flat sections of scalars and lists) as TOML."""

    def fmt(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        return repr(v)

    lines = []
    for f in fields(obj):
        section = getattr(obj, f.name)
        assert is_dataclass(section)
        lines.append(f"[{f.name}]")
        lines += [f"{k} = {fmt(v)}" for k, v in asdict(section).items()]
        lines.append("")
    return "\n".join(lines)
