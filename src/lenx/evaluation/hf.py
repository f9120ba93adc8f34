"""A local transformers causal LM, as `lenx eval --hf` reads it: the folder checked, its config,
tokenizer and weights loaded (local files only: nothing is ever downloaded), and the model wrapped
for lenx's protocol (`HFReader`: the NLL and the prediction of every scored token of a batch of
token sequences, and lenx.model.generate's KV-cache interface for the passkey task).

The model runs as transformers builds it from its config.json, so its own RoPE scaling (YaRN,
Llama 3's, dynamic NTK, ...) is applied; lenx's `--rope-scaling` does not apply. It runs in its
saved dtype under torch.no_grad, and the LM head is applied to the scored positions only, 1024 at a
time, so a long window never holds its [T, vocab] logits (unless the model changes its logits after
the head, e.g. soft-capping: then the model's own logits are used).

A lenx export (`lenx export`: config.json's model_type "lenx") is read with the installed lenx's own
classes (lenx.export.hf), which the folder's code only subclasses, so no code from a folder runs
(trust_remote_code stays off), and through LenxForCausalLM.hidden_states, so that a padded row is
read as it is alone (DAPE V2's last rows see the keys after them).

transformers is an optional extra (`pip install 'lenx[hf]'`): it is imported inside the functions.
"""

from contextlib import contextmanager
import inspect
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from ..config import ConfigError
from .batches import halving_batches

INSTALL = "lenx eval --hf needs transformers: pip install 'lenx[hf]'"
WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# config keys of models that change their logits after the LM head
LOGIT_CHANGES = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def require_transformers():
    try:
        import transformers
    except ImportError:
        raise ConfigError(INSTALL) from None
    return transformers


@contextmanager
def quiet():
    """transformers' warnings and progress bars off (lenx reports what matters in one line)."""
    from transformers.utils import logging

    level, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def lenx_classes(path: Path):
    """lenx.export.hf when `path` holds a lenx export, else None."""
    from ..export.folder import is_export

    if not is_export(path):
        return None
    from ..export import hf

    return hf


def _lenx_config(path: Path, classes):
    """The LenxConfig of a lenx export, checked to be one this lenx can build."""
    try:
        config = classes.LenxConfig.from_pretrained(path, local_files_only=True)
        classes.require_lenx(config.lenx_version or "0")
        config.lm_config()
    except (ValueError, OSError, TypeError, ImportError) as e:
        raise ConfigError(f"--hf {path}: a lenx export that this lenx cannot read ({_first_line(e)})") from None
    return config


def not_causal(config, causal_types, masked_types) -> str | None:
    """Why a config is not a causal LM's, in a few words; None when it is one. The rule: a config
    that says it is a decoder (is_decoder, XLM's causal) is one; an encoder-decoder is not; a type
    transformers has no causal LM class for is not; a type it also has a masked-LM class for is a
    bidirectional encoder (BERT, RoBERTa, ...), whose causal LM class is causal only when
    is_decoder is set, so it is not one without it. Every other type with a causal LM class
    (GPT-2, Llama, ...) is decoder-only."""
    kind = f"a {config.model_type!r} model"
    named = getattr(config, "architectures", None) or []
    named = f"; its config.json names {', '.join(named)}" if named else ""
    if getattr(config, "is_decoder", False) or getattr(config, "causal", False) is True:
        return None
    if getattr(config, "is_encoder_decoder", False):
        return f"{kind}, an encoder-decoder{named}"
    if type(config) not in causal_types:
        return f"{kind}: transformers has no AutoModelForCausalLM for it{named}"
    if type(config) in masked_types:
        return (f"{kind} with is_decoder false: a bidirectional encoder, whose every token sees the tokens after "
                f"it{named}")
    return None


def check_folder(path: Path):
    """(config, tokenizer) of a local transformers causal LM folder, before any weights are read;
    a one-line ConfigError when transformers is missing, the folder is missing, it is not a causal
    LM, or it has no weights or no fast tokenizer."""
    require_transformers()
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_MASKED_LM_MAPPING

    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"--hf {path} is not a folder (give a local transformers model folder; lenx never "
                          "downloads one)")
    if not (path / "config.json").is_file():
        raise ConfigError(f"--hf {path} is not a transformers model folder: it has no config.json")
    classes = lenx_classes(path)
    with quiet():
        try:
            config = _lenx_config(path, classes) if classes is not None else \
                AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        except ConfigError:
            raise
        except Exception as e:  # transformers raises ValueError, OSError, KeyError, ... for a bad config
            raise ConfigError(f"--hf {path}: transformers cannot read its config.json ({_first_line(e)})") from None
    if classes is None:
        why = not_causal(config, MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_MASKED_LM_MAPPING)
        if why:
            raise ConfigError(f"--hf {path} is not a causal LM ({why})")
    if not any(any(path.glob(pattern)) for pattern in WEIGHTS):
        raise ConfigError(f"--hf {path} has no weights (model.safetensors or pytorch_model.bin)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"--hf {path} has no tokenizer ({', '.join(TOKENIZER_FILES)}); save the model's "
                          "tokenizer into the folder with tokenizer.save_pretrained")
    with quiet():
        try:
            # given its config, AutoTokenizer reads no config.json (whose AutoConfig is an export's code)
            given = {"config": config} if classes is not None else {}
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False, **given)
        except Exception as e:
            raise ConfigError(f"--hf {path}: transformers cannot load its tokenizer ({_first_line(e)})") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"--hf {path}'s tokenizer is a slow (Python) one; lenx needs a fast tokenizer "
                          "(tokenizer.json) to map the model's tokens onto the corpus's text")
    return config, tokenizer


def rope_of(config) -> dict | None:
    """The model's RoPE settings as its config gives them (rope_parameters, or rope_scaling and
    rope_theta in older configs); None for a model without them."""
    params = getattr(config, "rope_parameters", None)
    if params is None:
        scaling, theta = getattr(config, "rope_scaling", None), getattr(config, "rope_theta", None)
        if scaling is None and theta is None:
            return None
        params = {**(scaling or {}), **({"rope_theta": theta} if theta is not None else {})}
    return {k: v for k, v in dict(params).items() if isinstance(v, (int, float, str, bool, list)) or v is None}


def config_summary(config) -> dict:
    """What an evaluation records of the model's config.json."""
    keys = ("model_type", "architectures", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings")
    out = {key: getattr(config, key, None) for key in keys}
    out["rope"] = rope_of(config)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    out["dtype"] = None if dtype is None else str(dtype).removeprefix("torch.")
    return out


def default_train_len(config) -> int | None:
    """The model's training length: its RoPE scaling's original_max_position_embeddings when it was
    extended, else max_position_embeddings (GPT-2's n_positions)."""
    rope = rope_of(config) or {}
    for value in (rope.get("original_max_position_embeddings"), getattr(config, "max_position_embeddings", None)):
        if isinstance(value, int) and value > 0:
            return value
    return None


def _model_section(tokenizer_json: str) -> dict:
    """What maps text to ids in a tokenizer.json: its normalizer, pre-tokenizer and model (vocabulary,
    merges)."""
    import json

    data = json.loads(tokenizer_json)
    return {key: data.get(key) for key in ("normalizer", "pre_tokenizer", "model")}


def tokenizer_summary(tokenizer, corpus) -> dict:
    """The model's tokenizer: its class, vocabulary, EOS, a hash of what maps text to ids, and
    whether that is the corpus's tokenizer (then the model reads the corpus's ids as they are)."""
    import hashlib
    import json

    mine = _model_section(tokenizer.backend_tokenizer.to_str())
    corpus_tok = corpus.tokenizer()
    same = corpus_tok is not None and mine == _model_section(corpus_tok.to_str())
    digest = hashlib.sha256(json.dumps(mine, sort_keys=True).encode()).hexdigest()
    return {"class": type(tokenizer).__name__, "vocab_size": len(tokenizer), "eos_id": tokenizer.eos_token_id,
            "sha256": digest, "same_as_corpus": same}


class _Cache:
    """The model's own KV cache between prefill and decode calls."""

    past = None


class HFReader:
    """A transformers causal LM on a device, read as lenx's protocol reads a model. lenx: the model
    is a lenx export's LenxForCausalLM (no position table; a padded row read as it is alone)."""

    def __init__(self, model, device: torch.device, lenx: bool = False):
        self.model, self.device, self.lenx = model, device, lenx
        params = inspect.signature(model.forward).parameters
        self._cache_key = "cache" if "cache" in params else "past_key_values"  # transformers 5 renamed it
        self._keep_last = "logits_to_keep" in params
        self.head_on_scored = self._head_matches()

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _hidden(self, ids: torch.Tensor, lengths: list[int] | None = None) -> torch.Tensor | None:
        """The base model's last hidden states [B, T, C] of a right-padded batch (lengths: each
        row's, None: no padding), or None when the base model gives none."""
        if self.lenx:
            return self.model.hidden_states(ids, None if lengths is None else ("right", lengths))
        return getattr(self.model.base_model(input_ids=ids, use_cache=False), "last_hidden_state", None)

    def _logits(self, ids: torch.Tensor, lengths: list[int] | None = None) -> torch.Tensor:
        if self.lenx and lengths is not None:  # the mask makes LenxForCausalLM read a padded row alone
            mask = torch.arange(ids.shape[1], device=ids.device)[None, :] < torch.tensor(lengths, device=ids.device)[:, None]
            return self.model(input_ids=ids, attention_mask=mask.long(), use_cache=False).logits
        return self.model(input_ids=ids, use_cache=False).logits

    @torch.no_grad()
    def _head_matches(self) -> bool:
        """Whether the logits are the LM head of the base model's last hidden states (checked on 8
        tokens), so the head can be applied to the scored positions alone."""
        config = self.model.config
        if any(getattr(config, key, None) not in (None, 1, 1.0) for key in LOGIT_CHANGES):
            return False
        base, head = self.model.base_model, self.model.get_output_embeddings()
        if base is self.model or head is None:
            return False
        x = (torch.arange(8, device=self.device) % config.vocab_size)[None]
        h = self._hidden(x)
        if h is None:
            return False
        full, mine = self._logits(x).float(), head(h).float()
        return mine.shape == full.shape and bool((mine - full).abs().max() <= 1e-5 * full.abs().max().clamp(min=1e-6))

    def position_limit(self) -> int | None:
        """The most tokens a model with learned absolute positions (GPT-2's wpe) can read; None when
        its positions have no table (RoPE, ALiBi, ...)."""
        if self.lenx:  # lenx's positions are the attention's, at any length (T5's bias table is no position table)
            return None
        inputs = self.model.get_input_embeddings()
        most = getattr(self.model.config, "max_position_embeddings", None)
        most = most if isinstance(most, int) and most > 0 else None

        def positions(name: str, m) -> bool:  # GPT-2's wpe, OPT's embed_positions (2 rows of offset), ...
            leaf = name.rsplit(".", 1)[-1]
            return "pos" in leaf or leaf == "wpe" or (most is not None and m.num_embeddings in (most, most + 2))

        tables = [m.num_embeddings for name, m in self.model.named_modules()
                  if isinstance(m, torch.nn.Embedding) and m is not inputs and positions(name, m)]
        if not tables:
            return None
        return min(min(tables), most) if most is not None else min(tables)

    @torch.no_grad()
    def _read_batch(self, seqs: list[np.ndarray], first: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        # The model reads each sequence but its last token, which is only predicted: a row of a
        # model that sees a few keys after it (DAPE V2) is then the row of lenx's own evaluation.
        T = max(len(s) for s in seqs) - 1
        if T < 1:  # nothing to predict
            return [(np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)) for _ in seqs]
        ids = torch.zeros(len(seqs), T, dtype=torch.long)
        targets = torch.zeros(len(seqs), T, dtype=torch.long)
        scored = torch.zeros(len(seqs), T, dtype=torch.bool)  # positions whose next token is scored
        for b, (s, f) in enumerate(zip(seqs, first)):
            s = torch.from_numpy(np.asarray(s, dtype=np.int64))
            ids[b, :len(s) - 1], targets[b, :len(s) - 1] = s[:-1], s[1:]
            scored[b, max(f, 1) - 1:len(s) - 1] = True
        # right padding: a causal model's real positions never see the padding after them (a lenx
        # model's padded rows are read alone)
        lengths = [len(s) - 1 for s in seqs]
        lengths = None if all(n == T for n in lengths) else lengths
        ids, scored = ids.to(self.device), scored.to(self.device)
        targets = targets.to(self.device)[scored]
        if self.head_on_scored:
            rows = self._hidden(ids, lengths)[scored]
            head = self.model.get_output_embeddings()
        else:
            rows = self._logits(ids, lengths)[scored]
            head = None
        nll, pred = [], []
        for s in range(0, len(rows), 1024):
            logits = (head(rows[s:s + 1024]) if head is not None else rows[s:s + 1024]).float()
            nll.append(F.cross_entropy(logits, targets[s:s + 1024], reduction="none").cpu())
            pred.append(logits.argmax(-1).cpu())
        counts = scored.sum(1).tolist()
        nll_rows = torch.cat(nll).split(counts) if nll else [torch.zeros(0)] * len(seqs)
        pred_rows = torch.cat(pred).split(counts) if pred else [torch.zeros(0, dtype=torch.long)] * len(seqs)
        return [(n.numpy(), p.numpy()) for n, p in zip(nll_rows, pred_rows)]

    def read(self, seqs: list[np.ndarray], first: list[int], budget: int, on_batch=None):
        """For each token sequence, the NLL (float32) and the argmax prediction of its tokens from
        index first[i] on (at least 1), each predicted from the tokens before it. Batches of up to
        `budget` tokens (one sequence at least); on CUDA out-of-memory the batch halves and is
        retried. on_batch(n) hears each finished batch."""
        out: list = []
        batch = max(1, budget // max(1, max(len(s) for s in seqs)))
        for start, stop, rows in halving_batches(len(seqs), batch,
                                                 lambda a, b: self._read_batch(seqs[a:b], first[a:b])):
            out += rows
            if on_batch is not None:
                on_batch(stop - start)
        return out

    # lenx.model.generate's interface: greedy answers of the passkey task
    def new_cache(self, batch: int, capacity: int, device=None, dtype=None) -> _Cache:
        return _Cache()

    def _step(self, idx: torch.Tensor, cache: _Cache, last_only: bool) -> torch.Tensor:
        kwargs = {"use_cache": True, self._cache_key: cache.past}
        if last_only and self._keep_last:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=idx, **kwargs)
        cache.past = out["cache"] if "cache" in out else out.get("past_key_values")
        return out.logits

    @torch.no_grad()
    def prefill(self, idx: torch.Tensor, cache: _Cache, lengths=None, progress=None) -> torch.Tensor:
        if lengths is not None and any(n != idx.shape[1] for n in lengths):
            raise ValueError("an HF model's passkey prompts are read one at a time, without padding")
        return self._step(idx, cache, True)[:, -1]

    @torch.no_grad()
    def decode(self, idx: torch.Tensor, cache: _Cache) -> torch.Tensor:
        return self._step(idx, cache, False)


def load_model(path: Path, device: torch.device) -> HFReader:
    """The model of a checked folder (check_folder) in its saved dtype, in eval mode on `device`."""
    transformers = require_transformers()
    from transformers import AutoModelForCausalLM

    major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    dtype_key = "dtype" if major_minor >= (4, 56) else "torch_dtype"  # renamed in transformers 4.56
    classes = lenx_classes(Path(path))
    with quiet():
        try:
            if classes is not None:
                model = classes.LenxForCausalLM.from_pretrained(Path(path), local_files_only=True, **{dtype_key: "auto"})
            else:
                model = AutoModelForCausalLM.from_pretrained(Path(path), local_files_only=True, trust_remote_code=False,
                                                             **{dtype_key: "auto"})
        except Exception as e:
            raise ConfigError(f"--hf {path}: transformers cannot load its weights ({_first_line(e)})") from None
    return HFReader(model.to(device).eval(), device, lenx=classes is not None)
