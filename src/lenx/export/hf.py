"""lenx's decoder LM as a transformers model: LenxConfig, LenxForCausalLM (forward, loss, generate()
over lenx's own KV cache) and LenxCache.

An exported folder's configuration_lenx.py and modeling_lenx.py subclass these two classes, so the
folder runs the installed lenx's model (one implementation of every method). This module imports
transformers; lenx.export imports it only when a folder is written or loaded.

transformers 5.x builds a model on the meta device and loads the weights into it; what it cannot
load are the buffers lenx computes when it builds a part (RoPE's frequencies, ALiBi's slopes), so
from_pretrained computes them again (LenxForCausalLM.restore_buffers).
"""

from dataclasses import asdict, fields

import torch
from torch.nn import functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..config import FORMER_DEFAULTS, LMConfig
from ..model.lm import LM, Block

# The name transformers gives the cache, in a model's outputs and in generate()'s model kwargs:
# "cache" in later 5.x releases (5.24), "past_key_values" in earlier ones (5.17).
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


# What generate() may be given for a model and lenx models do not take (forward() says so).
REFUSED = ("position_ids", "token_type_ids", "output_attentions", "output_hidden_states")


class LenxConfig(PretrainedConfig):
    """lenx's [model] section (`lenx`, a dict of lenx.config.LMConfig's fields), the lenx version
    that exported it and the training length, plus the attributes tools read from any config."""

    model_type = "lenx"
    lenx: dict | None = None
    lenx_version: str = ""
    method: str = ""  # the method, or the layout (model.layers)
    train_len: int = 0
    vocab_size: int = 256
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    max_position_embeddings: int = 0
    tie_word_embeddings: bool = True
    lenx_source: dict | None = None  # the run, step and corpus it was exported from

    def lm_config(self) -> LMConfig:
        """The LMConfig of the model; a one-line ValueError names the keys this lenx does not know
        (an export of a newer lenx). An export lists every key of its lenx, so one it lacks takes the
        value it had then (FORMER_DEFAULTS), as a run's config.toml does."""
        known = {f.name for f in fields(LMConfig)}
        values = FORMER_DEFAULTS["model"] | dict(self.lenx or {})
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"this model was exported by lenx {self.lenx_version or '?'} with model settings this "
                             f"lenx does not know ({', '.join(unknown)}): pip install -U lenx")
        return LMConfig(**values)


def config_for(cfg: LMConfig, *, version: str, train_len: int, eos_id: int | None, source: dict | None = None,
               auto_map: dict | None = None) -> LenxConfig:
    """The LenxConfig of a run's model: backend auto, so that the folder runs on any device; the
    training length as max_position_embeddings (what lm-eval cuts its inputs to by default)."""
    lenx = asdict(cfg) | {"backend": "auto"}
    return LenxConfig(lenx=lenx, lenx_version=version, method=cfg.label, train_len=train_len, lenx_source=source,
                      vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layer,
                      num_attention_heads=cfg.n_head, max_position_embeddings=train_len, eos_token_id=eos_id,
                      architectures=["LenxForCausalLM"], auto_map=auto_map, dtype="float32")


def require_lenx(version: str) -> None:
    """An ImportError unless the installed lenx is at least `version` (the one that exported a folder)."""
    from packaging.version import Version

    import lenx

    if Version(lenx.__version__) < Version(version):
        raise ImportError(f"this model was exported by lenx {version} and lenx {lenx.__version__} is installed: "
                          f"pip install -U 'lenx[hf]>={version}'")


class LenxCache:
    """lenx's KV cache (LM.new_cache, prefill, decode) as generate() carries it from step to step.
    It is allocated at the first forward, for the batch that forward brings and `capacity` tokens
    (generate() sizes it to prompt plus new tokens, as lenx's generate does: a scaled RoPE takes
    its factor from it); a forward past it moves the cache into one twice as large."""

    # what generate() asks of any cache: no torch.compile, no softmax-free layers, no rollback
    is_compileable, is_linear, is_croppable = False, (False,), False

    def __init__(self, capacity: int = 0):
        self.capacity, self.kv = capacity, None

    @property
    def length(self) -> int:
        return 0 if self.kv is None else self.kv.length

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def reserve(self, lm: LM, batch: int, new: int) -> None:
        """Room for `new` more tokens of `batch` sequences."""
        need = self.length + new
        if self.kv is None:
            self.kv = lm.new_cache(batch, max(self.capacity, need))
        elif self.kv.tokens.shape[0] != batch:
            raise ValueError(f"this cache holds {self.kv.tokens.shape[0]} sequences, the input {batch}")
        elif need > self.kv.capacity:
            old, n = self.kv, self.kv.length
            self.kv = lm.new_cache(batch, max(need, 2 * old.capacity))
            for dst, src in zip(self.kv.layers, old.layers):
                dst.copy_from(src, n)  # keys, values, MTA's queries, FoX's extras; a ring its last slots
            self.kv.tokens[:, :n], self.kv.length = old.tokens[:, :n], n
            self.kv.start.copy_(old.start)
        self.capacity = self.kv.capacity

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Keep the sequences beam search chose (beam_idx [batch])."""
        if self.kv is not None:
            for layer in self.kv.layers:
                layer.k, layer.v = layer.k[beam_idx], layer.v[beam_idx]
                if layer.q is not None:
                    layer.q = layer.q[beam_idx]
                layer.extra = {name: kept[beam_idx] for name, kept in layer.extra.items()}  # FoX's
            self.kv.tokens, self.kv.start = self.kv.tokens[beam_idx], self.kv.start[beam_idx]


def padding(mask: torch.Tensor | None, batch: int, length: int) -> tuple[str, list[int]] | None:
    """("right" or "left", the length of every sequence) of a padded batch's attention_mask [batch,
    length]: every row ones then zeros (right padding) or zeros then ones (left padding); None when
    nothing is padded. Any other mask is a ValueError: lenx's attention takes no mask."""
    if mask is None or bool(mask.all()):
        return None
    if mask.dim() != 2 or tuple(mask.shape) != (batch, length):
        raise ValueError(f"attention_mask must be [batch, length] = [{batch}, {length}], got {tuple(mask.shape)}")
    lengths = mask.long().sum(1)
    slots = torch.arange(length, device=mask.device)[None, :]
    if torch.equal(mask.bool(), slots < lengths[:, None]):
        return "right", lengths.tolist()
    if torch.equal(mask.bool(), slots >= length - lengths[:, None]):
        return "left", lengths.tolist()
    raise ValueError("lenx models take padding on one side of a batch only (each row of attention_mask ones, then "
                     "zeros; or zeros, then ones), never a mask with holes")


class LenxForCausalLM(PreTrainedModel, GenerationMixin):
    """lenx.model.LM under transformers: logits of LM.forward, a next-token loss with `labels`, and
    generate() through LM.prefill / LM.decode."""

    config_class = LenxConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"

    def __init__(self, config: LenxConfig):
        super().__init__(config)
        self.model = LM(config.lm_config())
        # {target: source} of the parameters LM shares (the output head is the embedding; T5's table is
        # every layer's): the weights file holds each once, and transformers ties them again on loading
        self._tied_weights_keys = shared_parameters(self)
        self.post_init()

    def _init_weights(self, module):
        """Nothing: LM initialises its own parameters, and loading replaces them."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # it keeps lenx's cache, never a transformers DynamicCache

    def get_input_embeddings(self):
        return self.model.wte

    def get_output_embeddings(self):
        return self.model.lm_head

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' from_pretrained, then every weight checked to be loaded and the computed
        buffers restored."""
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        missing = sorted(info.get("missing_keys") or [])
        if missing:
            raise ValueError(f"{args[0] if args else 'the folder'}'s model.safetensors lacks {len(missing)} weights of "
                             f"this model ({', '.join(missing[:3])}); export the run again with `lenx export`")
        model.restore_buffers()
        return (model, info) if want_info else model

    @torch.no_grad()
    def restore_buffers(self) -> None:
        """Compute the non-persistent buffers again: a block built on the CPU from a layer's config
        (its method and window of model.layers) has them, once per kind of layer."""
        fresh: dict = {}
        for block in self.model.blocks:
            kind = (block.attn.cfg.method, block.attn.cfg.window)
            if kind not in fresh:
                with torch.device("cpu"):
                    fresh[kind] = dict(_non_persistent(Block(block.attn.cfg, {})))
            for name, buf in _non_persistent(block):
                buf.copy_(fresh[kind][name])
        outside = [n for n, _ in _non_persistent(self.model) if not n.startswith("blocks.")]
        if outside:
            raise NotImplementedError(f"lenx export cannot restore the buffers {outside} outside the blocks")

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                past_key_values: LenxCache | None = None, cache: LenxCache | None = None, use_cache: bool | None = None,
                labels: torch.LongTensor | None = None, logits_to_keep: int = 0, return_dict: bool | None = None,
                inputs_embeds: torch.Tensor | None = None, **kwargs):
        """Logits [B, T, vocab] (the last `logits_to_keep` positions, 0: all). With use_cache or a
        cache, the tokens extend the cache and the cache comes back in the output: the first call
        may bring left-padded prompts (attention_mask zeros, then ones), which every later call's
        mask continues with ones. Without, a right- or left-padded batch gives every row's logits
        of a forward over that row alone."""
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("lenx models take input_ids (token ids), not inputs_embeds")
        asked = sorted(k for k, v in kwargs.items() if v is not None and v is not False)
        if asked:  # e.g. position_ids (lenx's attention places the tokens itself), output_hidden_states
            raise ValueError(f"lenx models take no {', '.join(asked)}: they return logits (and loss, cache) of "
                             "input_ids at positions 0, 1, ... of each sequence")
        state = cache if cache is not None else past_key_values
        if state is not None and not isinstance(state, LenxCache):
            raise ValueError(f"a lenx model keeps its own cache (LenxCache), not a {type(state).__name__}")
        B, T = input_ids.shape
        if state is not None or use_cache:
            state = LenxCache() if state is None else state
            logits = self._extend(input_ids, attention_mask, state, logits_to_keep)
        else:
            logits = self._full(input_ids, padding(attention_mask, B, T))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        out = CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE: state})
        return out if return_dict is not False else out.to_tuple()

    def hidden_states(self, idx: torch.Tensor, padded: tuple[str, list[int]] | None = None) -> torch.Tensor:
        """The last hidden states [B, T, C] (after the final LayerNorm) of a padded batch (padded:
        padding()'s side and lengths; None: no padding): each padded row's tokens read alone, zeros
        where a row has none; its padding keeps what the whole batch's forward gave there."""
        h = self.model.hidden(idx)
        side, lengths = padded or ("right", [])
        T = idx.shape[1]
        for b, n in enumerate(lengths):
            if n < T:  # a row alone: its first token at position 0, and no keys after its last (DAPE V2 sees them)
                real = slice(0, n) if side == "right" else slice(T - n, T)
                h[b, real] = self.model.hidden(idx[b:b + 1, real])[0] if n else 0
        return h

    def _full(self, idx: torch.Tensor, padded: tuple[str, list[int]] | None) -> torch.Tensor:
        return self.model.lm_head(self.hidden_states(idx, padded))

    def _extend(self, idx: torch.Tensor, mask: torch.Tensor | None, state: LenxCache, keep: int) -> torch.Tensor:
        B, m = idx.shape
        state.reserve(self.model, B, m)
        kv = state.kv
        if kv.length == 0:  # the prompts
            padded = padding(mask, B, m)
            lengths = None if padded is None else padded[1]
            if lengths is not None and min(lengths) == 0:
                raise ValueError("a row of attention_mask is all zeros: every prompt needs a token")
            if padded is not None and padded[0] == "right":
                raise ValueError("lenx models generate from left-padded prompts (each row of attention_mask zeros, "
                                 "then ones: tokenizer.padding_side = 'left'), not right-padded ones")
            if keep == 1:
                return self.model.prefill(idx, kv, lengths)[:, None]  # the usual forward (fused backends)
            if lengths is not None:  # every row: each sequence at its own positions, its padding masked
                kv.start.copy_(torch.tensor([m - n for n in lengths], device=kv.start.device))
            return self.model.decode(idx, kv)
        if mask is not None and not (bool(mask.all()) and not bool(kv.start.any())):
            n = kv.length + m
            want = torch.arange(n, device=mask.device)[None, :] >= kv.start.to(mask.device)[:, None]
            if tuple(mask.shape) != (B, n) or not torch.equal(mask.bool(), want):
                raise ValueError(f"with a cache of {kv.length} tokens, attention_mask must be [batch, {n}]: the "
                                 "prompts' left padding, then ones (lenx models pad the prompts only)")
        return self.model.decode(idx, kv)

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, generation_mode, batch_size,
                                      max_cache_length, *args, **kwargs):
        """generate()'s cache: a LenxCache for all of its tokens (max_cache_length + 1, as lenx's
        generate holds prompt plus new tokens)."""
        given = model_kwargs.get(CACHE)
        if given is not None and not isinstance(given, LenxCache):
            raise ValueError(f"a lenx model keeps its own cache (LenxCache), not a {type(given).__name__}")
        if given is None and generation_config.use_cache is not False:
            model_kwargs[CACHE] = LenxCache(max_cache_length + 1)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, past_key_values=None, cache=None,
                                      attention_mask=None, inputs_embeds=None, use_cache=True, **kwargs) -> dict:
        """The tokens the cache has not read yet, with the cache."""
        if inputs_embeds is not None:
            raise ValueError("lenx models take input_ids (token ids), not inputs_embeds")
        state = cache if cache is not None else past_key_values
        if state is not None:
            input_ids = input_ids[:, state.length:]
        refused = {k: kwargs[k] for k in REFUSED if kwargs.get(k) is not None}  # for forward() to name them
        return {"input_ids": input_ids, CACHE: state, "attention_mask": attention_mask, "use_cache": use_cache,
                "logits_to_keep": kwargs.get("logits_to_keep", 1), **refused}


def shared_parameters(module: torch.nn.Module) -> dict[str, str]:
    """{name: the first name of the same parameter} for every parameter `module` holds under more than one name."""
    first, tied = {}, {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in first:
            tied[name] = first[id(p)]
        else:
            first[id(p)] = name
    return tied


def _non_persistent(module: torch.nn.Module):
    """(name, buffer) of every buffer of `module` that its state dict leaves out."""
    for prefix, sub in module.named_modules():
        for name in sub._non_persistent_buffers_set:
            yield (f"{prefix}.{name}" if prefix else name), getattr(sub, name)


__all__ = ["CACHE", "LenxCache", "LenxConfig", "LenxForCausalLM", "config_for", "require_lenx", "shared_parameters"]
