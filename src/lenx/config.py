"""Run configuration: dataclasses, TOML presets and dotted command-line overrides.

A run is configured by one TOML file with the sections [model], [train], [data] and [eval], then
`--set section.key=value` overrides (values parse as TOML: `train.lr=3e-4`, `model.method=kerple`,
`eval.lengths=[128,256]`). Unknown sections and keys are errors that suggest the nearest name.
"""

from dataclasses import asdict, dataclass, field, fields, is_dataclass
import difflib
from pathlib import Path
import tomllib
import typing

from .model import LMConfig

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
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | bf16 | fp32
    compile: bool = False
    ckpt_every: int = 200
    log_every: int = 10
    parallel: str = "ddp"  # ddp | fsdp (only used under torchrun)


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


def validate(cfg: RunConfig) -> None:
    from .attention.methods import parse_method

    parse_method(cfg.model.method)
    t = cfg.train
    if t.batch_size % t.grad_accum:
        raise ConfigError(f"train.batch_size {t.batch_size} is not divisible by train.grad_accum {t.grad_accum}")
    for name in ("seq_len", "batch_size", "steps", "grad_accum", "ckpt_every", "log_every"):
        if getattr(t, name) < 1:
            raise ConfigError(f"train.{name} must be >= 1")
    if t.precision not in ("auto", "bf16", "fp32"):
        raise ConfigError(f"train.precision must be auto, bf16 or fp32, got {t.precision!r}")
    if t.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"train.device must be auto, cpu or cuda, got {t.device!r}")
    if t.parallel not in ("ddp", "fsdp"):
        raise ConfigError(f"train.parallel must be ddp or fsdp, got {t.parallel!r}")


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
