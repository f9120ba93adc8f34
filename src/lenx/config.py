"""Run configuration: dataclasses, TOML presets and dotted command-line overrides.

A run is configured by one TOML file with the sections [model], [train], [data] and [eval], then
`--set section.key=value` overrides (values parse as TOML: `train.lr=3e-4`, `model.method=kerple`,
`eval.lengths=[128,256]`). Unknown sections and keys are errors that suggest the nearest name.

This module imports nothing from lenx: it checks the values of [train], [data] and [eval]
(`validate`); the [model] section is judged next to the model, with the attention registries and
a build on the meta device (lenx.model.check_config).
"""

from dataclasses import asdict, dataclass, field, fields, is_dataclass
import difflib
import math
from pathlib import Path
import re
import typing

import torch

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as the tomli package (a dependency there)
    import tomli as tomllib

PRESET_DIR = Path(__file__).parent / "configs"


class ConfigError(ValueError):
    pass


@dataclass
class AttentionConfig:
    """Every knob of every attention part; a part reads only its own."""

    method: str = "rope"
    backend: str = "auto"  # auto | dense | chunked | sdpa | flex | triton
    chunk_size: int = 256  # query rows per block on the chunked path
    causal: bool = True  # False for encoders (CHE): biases use |i - j|, DAPE V2 drops the tril
    window: int = 0  # sliding window: each query sees its `window` most recent keys (0 = global; causal only)
    rope_base: float = 10000.0
    # RoPE context extension (attention/rope.py): none | pi | ntk | dynamic-ntk | yarn
    rope_scaling: str = "none"
    rope_scaling_factor: float = 0.0  # s; 0 = auto: the length processed / rope_train_len (at least 1)
    rope_train_len: int = 0  # the length the scaling extends from (0: none set; evaluation fills it in)
    rope_yarn_beta_fast: float = 32.0
    rope_yarn_beta_slow: float = 1.0
    rope_fraction: float = 1.0  # p-RoPE: the share of each head's dims rotated (the highest frequencies)
    dape_hidden: int = 32  # D
    dape_kernel: int = 3  # k for dapev2 (dape is always k = 1)
    dape_leak: bool = False  # drop the tril: the paper's information-leakage experiment only
    mta_query_kernel: int = 6  # MTA's c_q: the query convolution reads this many queries, the row's own and earlier
    mta_key_kernel: int = 11  # MTA's c_k (odd: centred on each key)
    mta_head_group: int = 0  # MTA's c_h: heads mixed together (0: all heads, the paper's 16 of 16)
    # the defaults are the released MTA configs (facebookresearch/RAM projects/mta/configs/*_mta.yaml)
    mta_head_mix: str = "both"  # none | pre | post | both: head mixing before and/or after the softmax
    mta_every: int = 4  # the query-key convolution on layers l % mta_every == mta_every // 2 (at least the last)
    mta_group_norm: bool = True  # per-head RMS norm with a scalar sigmoid gate on each head's output
    mta_post_conv: bool = True  # a second query-key convolution, of the probabilities after the softmax
    mta_post_query_kernel: int = 6  # its c_q' (the released configs' 6)
    mta_post_key_kernel: int = 11  # its c_k' (odd; the released configs' 11)
    fire_width: int = 32
    fire_L_init: float = 512.0
    fire_activation: str = "auto"  # auto: relu alone, leaky_relu under a DAPE processor
    t5_buckets: int = 32
    t5_max_distance: int = 128
    cope_npos: int = 64
    sb_attend_current: bool = False
    sb_remainder: str = "value"  # value | head | drop
    # query temperatures (attention/temperature.py): ssmax-, logn-, l4temp- before a method's name
    temp_train_len: int = 0  # log-n's training length L (0: train.seq_len, which load_config writes in)
    temp_ssmax_init: float = 1.0  # SSMax's s_h at initialisation
    temp_floor_scale: float = 8192.0  # Llama 4's floor_scale
    temp_attn_scale: float = 0.1  # Llama 4's attn_scale
    pope_base: float = 10000.0  # PoPE's frequencies base^(-c/d), c = 0 .. d - 1
    # FoX's Pro block (attention/fox.py), each off by default and for the fox methods only
    fox_output_gate: bool = False
    fox_qk_norm: bool = False
    fox_kv_shift: bool = False
    fox_output_norm: bool = False


@dataclass
class LMConfig(AttentionConfig):
    """The [model] section: the decoder LM (lenx.model.LM) and its attention."""

    vocab_size: int = 256
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 128
    mlp_ratio: int = 4
    activation: str = "gelu"  # gelu | relu (the CHE encoder uses ReLU)
    dropout: float = 0.0
    # each layer's method and window (attention/layouts.py): "rope:w4096,rope:w4096,rope:w4096,nope",
    # "3*(rope:w4096),nope" or a preset (`lenx list`); empty: model.method in every layer
    layers: str = ""

    @property
    def label(self) -> str:
        """What the model is called in results: its method, or its layout (a preset's name, or the text)."""
        return "".join(self.layers.split()).lower() if self.layers.strip() else self.method


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
    # random: windows drawn anywhere in the train stream, with replacement | pass: one pass over its
    # non-overlapping windows, each read once (lenx.training.batches)
    sampling: str = "random"
    pass_block: int = 64  # pass: windows are shuffled within blocks of this many steps' worth, in stream order
    # stream: windows read as they are, attention across documents | masked: no token attends across a
    # document boundary and positions restart at each document (lenx.training.batches)
    documents: str = "stream"
    # Sequence-length warm-up (lenx.training.batches.seq_len_at): the first seq_len_warmup steps read
    # shorter windows, from seq_len_start doubling up to seq_len, with as many tokens a step; 0 = off
    seq_len_warmup: int = 0
    seq_len_start: int = 0  # the warm-up's first length: seq_len divided by a power of two


@dataclass
class EvalConfig:
    lengths: list[int] = field(default_factory=list)  # empty: powers of two from seq_len to max_length
    max_length: int = 8192
    windows: int = 64  # evaluation windows per length, the same for every method
    scored: int = 256  # perplexity of the last `scored` tokens (the paper's protocol)
    split: str = "test"
    seed: int = 1234
    token_budget: int = 0  # tokens per forward batch; 0 = automatic
    per_position: bool = False  # also the mean NLL per position, binned (`lenx eval --per-position`)


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


# Defaults that changed, with the value they had before. A run folder's config.toml lists every key of
# the lenx that wrote it (to_toml), so a key it lacks is newer than the run, which trained with the
# value here, not with today's default: load_config fills it in for a run's config.toml (lenx.runs.run_config,
# and `lenx train -c RUN/config.toml`, which trains that run again).
# `mta` became the released MTA configuration (pre-softmax head mixing and the post-softmax convolution).
FORMER_DEFAULTS = {"model": {"mta_head_mix": "post", "mta_post_conv": False}}


def load_config(name_or_path: str | Path | None = None, overrides: list[str] | tuple = (),
                recorded: bool = False) -> RunConfig:
    """A preset or TOML file, then `section.key=value` overrides. recorded: the file is a run folder's
    config.toml, whose missing keys take FORMER_DEFAULTS (the values the run trained with); so is
    any config.toml with the meta.json of a run beside it."""
    cfg = RunConfig()
    if name_or_path is not None:
        path = resolve_config_path(name_or_path)
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML ({e})") from None
        if recorded or (path.name == "config.toml" and (path.parent / "meta.json").is_file()):
            for section, former in FORMER_DEFAULTS.items():
                if isinstance(data.get(section, {}), dict):  # a section that is not a table: apply_dict's error
                    data[section] = former | data.get(section, {})
        apply_dict(cfg, data)
    for text in overrides:
        section, name, value = parse_override(text)
        apply_dict(cfg, {section: {name: value}})
    validate(cfg)
    # a log-n temperature is relative to the run's training length; written in so that evaluation,
    # decoding and export read the length the run trained at
    cfg.model.temp_train_len = cfg.model.temp_train_len or cfg.train.seq_len
    return cfg


# What eval.split may name: the splits every prepared corpus has (lenx.data.corpus.SPLITS).
SPLITS = ("train", "val", "test")


def validate(cfg: RunConfig) -> None:
    """Check every field of [train], [eval] and [data] against its range or choices; raises a one-line
    ConfigError that names the key. [model] is lenx.model.check_config's, and what depends on the
    machine lenx.model.check_device's."""
    _validate_train(cfg.train)
    _validate_eval(cfg.eval)
    check(cfg.data.corpus.strip() != "", "data.corpus", "a corpus name", cfg.data.corpus)
    check(cfg.data.root.strip() != "", "data.root", "a folder", cfg.data.root)


def check(ok: bool, key: str, rule: str, value) -> None:
    if not ok:
        raise ConfigError(f"{key} must be {rule}, got {value!r}")


def at_least(section: str, obj, low: int, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        check(value >= low, f"{section}.{name}", f">= {low}", value)


def one_of(key: str, value, choices) -> None:
    check(value in choices, key, "one of " + ", ".join(choices), value)


def positive(key: str, value: float) -> None:
    check(math.isfinite(value) and value > 0, key, "a positive number", value)


def fraction(key: str, value: float, top_open: bool = False) -> None:
    ok = 0 <= value < 1 if top_open else 0 <= value <= 1
    check(ok, key, "in [0, 1)" if top_open else "in [0, 1]", value)


def _validate_train(t: TrainConfig) -> None:
    at_least("train", t, 1, "seq_len", "batch_size", "grad_accum", "steps", "ckpt_every", "log_every",
             "val_batches", "pass_block")
    at_least("train", t, 0, "seed", "val_every", "keep_every")
    if t.batch_size % t.grad_accum:
        raise ConfigError(f"train.batch_size ({t.batch_size}) must be divisible by train.grad_accum ({t.grad_accum})")
    positive("train.lr", t.lr)
    positive("train.grad_clip", t.grad_clip)
    fraction("train.min_lr_ratio", t.min_lr_ratio)
    fraction("train.warmup_frac", t.warmup_frac)
    fraction("train.beta1", t.beta1, top_open=True)
    fraction("train.beta2", t.beta2, top_open=True)
    check(math.isfinite(t.weight_decay) and t.weight_decay >= 0, "train.weight_decay", ">= 0", t.weight_decay)
    _check_device_name(t.device, "train.device")
    one_of("train.precision", t.precision, ("auto", "bf16", "fp32"))
    one_of("train.parallel", t.parallel, ("ddp", "fsdp"))
    one_of("train.sampling", t.sampling, ("random", "pass"))
    one_of("train.documents", t.documents, ("stream", "masked"))
    _validate_length_warmup(t)


def _validate_length_warmup(t: TrainConfig) -> None:
    """train.seq_len_warmup and train.seq_len_start: doublings from the start length that tile
    train.seq_len exactly, each of them at least one step, all within train.steps."""
    at_least("train", t, 0, "seq_len_warmup", "seq_len_start")
    if not t.seq_len_warmup:
        check(t.seq_len_start == 0, "train.seq_len_start", "0 while train.seq_len_warmup is 0 (no warm-up; set "
              "train.seq_len_warmup to the steps it lasts)", t.seq_len_start)
        return
    check(t.seq_len_start > 0, "train.seq_len_start", "set when train.seq_len_warmup is on (the length the "
          "warm-up starts from, e.g. train.seq_len_start=512)", t.seq_len_start)
    ratio = t.seq_len // t.seq_len_start
    check(t.seq_len_start < t.seq_len and t.seq_len % t.seq_len_start == 0 and ratio & (ratio - 1) == 0,
          "train.seq_len_start", f"train.seq_len ({t.seq_len}) divided by a power of two, smaller than it "
          f"({t.seq_len // 2}, {t.seq_len // 4}, ...)", t.seq_len_start)
    stages = ratio.bit_length() - 1
    check(stages <= t.seq_len_warmup <= t.steps, "train.seq_len_warmup",
          f"between {stages} (one step for each shorter length) and train.steps ({t.steps})", t.seq_len_warmup)


def _validate_eval(e: EvalConfig) -> None:
    at_least("eval", e, 1, "max_length", "windows", "scored")
    at_least("eval", e, 0, "seed", "token_budget")
    check(all(L >= 1 for L in e.lengths), "eval.lengths", "lengths >= 1", e.lengths)
    one_of("eval.split", e.split, SPLITS)


def _check_device_name(name: str, key: str) -> None:
    check(name in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", name) is not None, key,
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
