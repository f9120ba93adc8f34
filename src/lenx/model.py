"""A small decoder LM that carries any lenx attention (it does not know which), and the check of a
run config against it (check_config, check_device)."""

from dataclasses import replace
import math

import torch
from torch import nn
from torch.nn import functional as F

from .attention import Attention
from .attention.backends import BACKENDS, get_backend, plan_backend
from .attention.cache import LayerCache
from .attention.methods import parse_method
from .attention.rope import SCALINGS
from .attention.stickbreaking import REMAINDER_MODES
from .config import (ConfigError, LMConfig, RunConfig, at_least, check, fraction, one_of, positive, resolve_device,
                     validate)


class MLP(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)
        if cfg.activation not in ("gelu", "relu"):
            raise ValueError(f"model.activation must be gelu or relu, got {cfg.activation!r}")
        self.act = F.gelu if cfg.activation == "gelu" else F.relu

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: LMConfig, shared: dict):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg, cfg.n_head, cfg.d_model, shared)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, cache: LayerCache | None = None):
        x = x + self.drop(self.attn(self.ln1(x), cache))
        return x + self.drop(self.mlp(self.ln2(x)))

    def extend(self, x, cache: LayerCache, start: int):
        """Rows x [B, R, C] at positions start.. (see Attention.extend)."""
        x = x + self.drop(self.attn.extend(self.ln1(x), cache, start))
        return x + self.drop(self.mlp(self.ln2(x)))


class KVCache:
    """What decoding keeps: every layer's keys and values and the tokens, for `capacity` positions."""

    def __init__(self, layers: list[LayerCache], tokens: torch.Tensor):
        self.layers, self.tokens, self.length = layers, tokens, 0

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1]


class LM(nn.Module):
    """Pre-LayerNorm GPT-style decoder with tied embeddings and no absolute positions: all position
    information comes from the attention method, so the model runs at any length."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        shared: dict = {}  # parts shared across layers (the T5 bias table)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, shared) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self._init_weights()

    def _init_weights(self):
        # GPT-2 style for the projections and embeddings only; the position parts keep their own init.
        nn.init.normal_(self.wte.weight, std=0.02)
        for block in self.blocks:
            for lin in (block.attn.qkv, block.mlp.fc):
                nn.init.normal_(lin.weight, std=0.02)
            for lin in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * self.cfg.n_layer))

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits = self.lm_head(self.hidden(idx))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)
        return logits, loss

    # --- decoding with a KV cache ---------------------------------------------------------------
    # Every method processes each query row on its own, so a new token needs only its own row of
    # scores against the cached keys. DAPE V2's 1 x k convolution is the one subtlety: the row of
    # position r reads the conv at keys up to r + k//2, whose inputs are zero (tril) but which exist
    # only once those tokens do (the forward zero-pads the key axis past the sequence's end). So a
    # row is final only when `halo` = k//2 tokens follow it, and each step recomputes the last
    # `halo` rows with the new one: every step's logits are then exactly the last row of a full
    # forward over the tokens so far.

    @property
    def halo(self) -> int:
        """Positions before the newest whose outputs change when a token is appended."""
        return max(b.attn.processor.halo if b.attn.processor is not None else 0 for b in self.blocks)

    def new_cache(self, batch: int, capacity: int, device=None, dtype=None) -> KVCache:
        """An empty cache for `batch` sequences of up to `capacity` tokens (prompt and generated)."""
        for b in self.blocks:
            if not b.attn.cfg.causal or (b.attn.processor is not None and b.attn.processor.leak):
                raise ValueError(f"{self.cfg.method} sees future keys here (non-causal, or DAPE V2 leak=True), "
                                 "so it cannot decode token by token")
        p = self.wte.weight
        device = p.device if device is None else device
        dtype = p.dtype if dtype is None else dtype
        layers = [LayerCache(batch, self.cfg.n_head, self.cfg.d_model // self.cfg.n_head, capacity, device, dtype)
                  for _ in self.blocks]
        return KVCache(layers, torch.zeros(batch, capacity, dtype=torch.long, device=device))

    def prefill(self, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Read the prompts idx [B, T] into an empty cache with the usual forward (the planner's
        backends) -> logits of the last position [B, vocab]."""
        if cache.length:
            raise ValueError("prefill needs an empty cache; append tokens with decode()")
        if idx.shape[1] > cache.capacity:
            raise ValueError(f"a prompt of {idx.shape[1]} tokens does not fit a cache of {cache.capacity}")
        x = self.wte(idx)
        for block, layer in zip(self.blocks, cache.layers):
            x = block(x, layer)
        cache.tokens[:, : idx.shape[1]] = idx
        cache.length = idx.shape[1]
        return self.lm_head(self.ln_f(x[:, -1]))

    def decode(self, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Append tokens idx [B, m] (usually m = 1) -> logits of the new positions [B, m, vocab]: their
        rows of a full forward over all the tokens so far (so the last is the next token's
        distribution). O(T) per layer and token."""
        n, m = cache.length, idx.shape[1]
        if n + m > cache.capacity:
            raise ValueError(f"the cache holds {cache.capacity} tokens; {n + m} do not fit")
        cache.tokens[:, n:n + m] = idx
        start = max(0, n - self.halo)
        x = self.wte(cache.tokens[:, start:n + m])
        for block, layer in zip(self.blocks, cache.layers):
            x = block.extend(x, layer, start)
        cache.length = n + m
        return self.lm_head(self.ln_f(x[:, n - start:]))

    def backends(self, device: torch.device) -> list[str]:
        return [block.attn.backend_for(device) for block in self.blocks]

    def kernels(self) -> list[str | None]:
        """The fused kernel each layer's DAPE V2 processor last ran (None: none, or no such choice)."""
        return [getattr(block.attn.processor, "kernel", None) for block in self.blocks]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


# --- a run config, checked against the model ----------------------------------------------------

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
        raise ConfigError(f"model: {cfg.model.method} cannot be built with these settings: {e}") from None
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
        # every layer has the same parts: one layer answers for all
        _check_backend(_build_meta(replace(cfg.model, n_layer=1, backend="auto")), backend, dev)
        if training and not get_backend(backend).trains(dev):
            raise ConfigError(f"model.backend={backend} cannot train on {dev.type} (it has no backward there); "
                              "use model.backend=chunked or auto")
    return dev


def _check_model(m: LMConfig) -> None:
    try:
        parse_method(m.method)
    except ValueError as e:
        raise ConfigError(f"model.method: {e}") from None
    at_least("model", m, 1, "vocab_size", "n_layer", "n_head", "d_model", "mlp_ratio", "chunk_size",
             "dape_hidden", "fire_width", "cope_npos")
    if m.d_model % m.n_head:
        raise ConfigError(f"model.d_model ({m.d_model}) must be divisible by model.n_head ({m.n_head})")
    check(m.dape_kernel % 2 == 1 and m.dape_kernel >= 1, "model.dape_kernel",
          "an odd integer >= 1 (the 1xk kernel is centred on each key)", m.dape_kernel)
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
    at_least("model", m, 0, "rope_train_len")
    check(m.rope_scaling == "none" or m.rope_train_len >= 1, "model.rope_train_len",
          f">= 1 with model.rope_scaling={m.rope_scaling} (the training length the scaling extends)", m.rope_train_len)
    check(m.causal, "model.causal", "true (an LM that sees the tokens it predicts learns nothing; "
          "bidirectional encoders are `lenx che`)", m.causal)


def _build_meta(model_cfg: LMConfig) -> LM:
    """The LM of model_cfg, its weights on the meta device (they take no memory)."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # building must not move the caller's random state
        return LM(model_cfg)


def _check_backend(model: LM, backend: str, device: torch.device) -> None:
    try:
        plan_backend(model.blocks[0].attn.parts, device, backend)
    except ValueError as e:
        raise ConfigError(f"model.backend={backend} (model.method={model.cfg.method}) on {device.type}: {e}") from None
