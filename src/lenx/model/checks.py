"""A run config checked against the model, before any work starts: check_config (every [model]
field, the other sections, and a build on the meta device) and check_device (what depends on the
machine). Errors are one-line ConfigErrors that name the key."""

from dataclasses import replace
import math

import torch

from ..attention.backends import BACKENDS, get_backend, plan_backend
from ..attention.layouts import layer_methods
from ..attention.methods import parse_method
from ..attention.mta import HEAD_MIXES
from ..attention.rope import SCALINGS
from ..attention.fox import SWITCHES as FOX_SWITCHES
from ..attention.stickbreaking import REMAINDER_MODES
from ..config import (ConfigError, LMConfig, RunConfig, at_least, check, fraction, one_of, positive, resolve_device,
                      validate)
from .lm import LM


def check_config(cfg: RunConfig) -> None:
    """Check every field of [model] against its range or choices (the method, backend, scaling and
    remainder names against the attention registries), then the other sections (lenx.config.validate),
    then build the model on the meta device (no memory and no time, even for 350m) so that what a run
    builds is known to build. Raises a one-line ConfigError that names the key. What depends on the
    machine is check_device's."""
    _check_model(cfg.model)
    validate(cfg)
    try:
        model = _build_meta(replace(cfg.model, backend="auto"))
    except (ValueError, AssertionError) as e:
        raise ConfigError(f"model: {cfg.model.label} cannot be built with these settings: {e}") from None
    if cfg.model.backend != "auto":
        # judged where the backend runs at all (triton: CUDA); check_device judges the device in use
        _check_backend(model, cfg.model.backend, torch.device("cuda" if cfg.model.backend == "triton" else "cpu"))


def check_device(cfg: RunConfig, device: str, key: str = "train.device", training: bool = True) -> torch.device:
    """check_config, then what it cannot know: `device` (auto, cpu, cuda or cuda:N; `key` names where
    it was given) exists on this machine, and the forced attention backend runs on it, and trains on
    it when `training`. Returns the device."""
    check_config(cfg)
    dev = resolve_device(device, key)
    backend = cfg.model.backend
    if backend != "auto":
        # a masked run's every forward carries document ids, which the plan reads
        _check_backend(_build_meta(replace(cfg.model, backend="auto")), backend, dev,
                       training and cfg.train.documents == "masked")
        if training and not get_backend(backend).trains(dev):
            raise ConfigError(f"model.backend={backend} cannot train on {dev.type} (it has no backward there); "
                              "use model.backend=chunked or auto")
    return dev


def with_backend(cfg: RunConfig, backend: str, device: str, key: str = "--device") -> RunConfig:
    """`cfg` with model.backend forced to `backend` (`--backend` of eval and generate), judged on the
    device the command runs on, after the device itself (the config's own check judges triton where
    it runs at all, on CUDA): one error, the same for every command."""
    dev = check_device(cfg, device, key=key, training=False)
    _check_backend(_build_meta(replace(cfg.model, backend="auto")), backend, dev)
    return replace(cfg, model=replace(cfg.model, backend=backend))


def _check_model(m: LMConfig) -> None:
    try:
        parse_method(m.method)
    except ValueError as e:
        raise ConfigError(f"model.method: {e}") from None
    at_least("model", m, 1, "vocab_size", "n_layer", "n_head", "d_model", "mlp_ratio", "chunk_size",
             "dape_hidden", "fire_width", "cope_npos")
    if m.d_model % m.n_head:
        raise ConfigError(f"model.d_model ({m.d_model}) must be divisible by model.n_head ({m.n_head})")
    _check_layout(m)
    check(m.dape_kernel % 2 == 1 and m.dape_kernel >= 1, "model.dape_kernel",
          "an odd integer >= 1 (the 1xk kernel is centred on each key)", m.dape_kernel)
    _check_mta(m)
    check(m.t5_buckets >= 2, "model.t5_buckets", ">= 2", m.t5_buckets)
    check(m.t5_max_distance > m.t5_buckets // 2, "model.t5_max_distance",
          f"above the exact buckets (model.t5_buckets // 2 = {m.t5_buckets // 2})", m.t5_max_distance)
    positive("model.rope_base", m.rope_base)
    positive("model.fire_L_init", m.fire_L_init)
    fraction("model.dropout", m.dropout, top_open=True)
    one_of("model.backend", m.backend, ("auto", *BACKENDS))
    one_of("model.activation", m.activation, ("gelu", "relu"))
    one_of("model.fire_activation", m.fire_activation, ("auto", "relu", "leaky_relu"))
    one_of("model.sb_remainder", m.sb_remainder, REMAINDER_MODES)
    one_of("model.rope_scaling", m.rope_scaling, SCALINGS)
    check(m.rope_scaling_factor == 0 or m.rope_scaling_factor >= 1, "model.rope_scaling_factor",
          "0 (auto: the length processed / model.rope_train_len) or a number >= 1", m.rope_scaling_factor)
    at_least("model", m, 0, "rope_train_len", "window")
    check(m.rope_scaling == "none" or m.rope_train_len >= 1, "model.rope_train_len",
          f">= 1 with model.rope_scaling={m.rope_scaling} (the training length the scaling extends)", m.rope_train_len)
    at_least("model", m, 0, "temp_train_len")
    positive("model.temp_ssmax_init", m.temp_ssmax_init)  # a scale <= 0 flips or flattens every row
    positive("model.temp_floor_scale", m.temp_floor_scale)
    check(math.isfinite(m.temp_attn_scale) and m.temp_attn_scale >= 0, "model.temp_attn_scale", ">= 0",
          m.temp_attn_scale)
    check(math.isfinite(m.pope_base) and m.pope_base > 1, "model.pope_base", "a number above 1", m.pope_base)
    fox = [name for name in FOX_SWITCHES if getattr(m, name)]
    if fox and not any(parse_method(name).base == "fox" for name in layer_methods(m.method, m.layers, m.n_layer)):
        raise ConfigError(f"model.{fox[0]} is an option of FoX's Pro block: it needs a fox method (fox, dapev2-fox, "
                          f"stickbreaking-fox, ...), not model.method={m.method}")
    check(m.causal, "model.causal", "true (an LM that sees the tokens it predicts learns nothing; "
          "bidirectional encoders are `lenx che`)", m.causal)


def _check_mta(m: LMConfig) -> None:
    check(m.mta_key_kernel % 2 == 1 and m.mta_key_kernel >= 1, "model.mta_key_kernel",
          "an odd integer >= 1 (the kernel is centred on each key)", m.mta_key_kernel)
    check(m.mta_query_kernel >= 1, "model.mta_query_kernel", ">= 1 (the row's own query and earlier ones)",
          m.mta_query_kernel)
    check(m.mta_head_group >= 0 and (m.mta_head_group == 0 or m.n_head % m.mta_head_group == 0),
          "model.mta_head_group", f"0 (all heads) or a divisor of model.n_head ({m.n_head})", m.mta_head_group)
    one_of("model.mta_head_mix", m.mta_head_mix, HEAD_MIXES)
    check(m.mta_every >= 1, "model.mta_every", ">= 1", m.mta_every)
    check(m.mta_post_key_kernel % 2 == 1 and m.mta_post_key_kernel >= 1, "model.mta_post_key_kernel",
          "an odd integer >= 1 (the kernel is centred on each key)", m.mta_post_key_kernel)
    check(m.mta_post_query_kernel >= 1, "model.mta_post_query_kernel",
          ">= 1 (the row's own probabilities and earlier rows')", m.mta_post_query_kernel)


def _check_layout(m: LMConfig) -> None:
    """model.layers (attention.layouts) and partial RoPE (model.rope_fraction)."""
    try:
        methods = layer_methods(m.method, m.layers, m.n_layer)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if m.layers.strip():
        check(m.window == 0, "model.window", "0 with model.layers (each entry gives its layer's window: method:wW)",
              m.window)
    check(0 < m.rope_fraction <= 1, "model.rope_fraction", "in (0, 1] (the share of each head's dims RoPE rotates)",
          m.rope_fraction)
    if m.rope_fraction != 1:
        if not any(parse_method(name).base == "rope" for name in methods):
            raise ConfigError(f"model.rope_fraction applies to RoPE layers and {_label(m)} has none; leave it at 1")
        rotated = m.rope_fraction * (m.d_model // m.n_head)
        check(abs(rotated - round(rotated)) < 1e-6 and round(rotated) % 2 == 0, "model.rope_fraction",
              f"a fraction of the head dimension {m.d_model // m.n_head} that is an even number of dims "
              f"(rotated in pairs)", m.rope_fraction)


def _build_meta(model_cfg: LMConfig) -> LM:
    """The LM of model_cfg, its weights on the meta device (they take no memory)."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # building must not move the caller's random state
        return LM(model_cfg)


def _label(m: LMConfig) -> str:
    return f"model.layers={m.layers}" if m.layers.strip() else f"model.method={m.method}"


def _check_backend(model: LM, backend: str, device: torch.device, segments: bool = False) -> None:
    for i, block in enumerate(model.blocks):
        try:
            plan_backend(replace(block.attn.parts, segments=segments), device, backend)
        except ValueError as e:
            where = f"layer {i}: {block.attn.spec.name}" if model.cfg.layers.strip() else _label(model.cfg)
            raise ConfigError(f"model.backend={backend} ({where}) on {device.type}: {e}") from None
