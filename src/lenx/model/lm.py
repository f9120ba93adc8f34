"""A small decoder LM that carries any lenx attention (it does not know which), with KV-cache
decoding (prefill, decode)."""

from dataclasses import replace
import math

import torch
from torch import nn
from torch.nn import functional as F

from ..attention import Attention
from ..attention.backends import plan_note
from ..attention.cache import LayerCache, RingCache, StepRows
from ..attention.layouts import layer_configs
from ..attention.masks import check_segments, positions
from ..config import LMConfig


RING_ROWS = 64  # new tokens one decode step appends at most with a windowed layer (decode splits more)


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
    def __init__(self, cfg: LMConfig, shared: dict, layer: int = 0):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg, cfg.n_head, cfg.d_model, shared, layer, cfg.n_layer)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, cache: LayerCache | None = None, rows: list[int] | None = None, at: int = 0,
                segments=None, positions=None, memo: dict | None = None):
        x = x + self.drop(self.attn(self.ln1(x), cache, rows, at, segments, positions, memo))
        return x + self.drop(self.mlp(self.ln2(x)))

    def extend(self, x, cache: LayerCache, step: StepRows):
        """Rows x [B, R, C] in cache slots step.rows (see Attention.extend)."""
        x = x + self.drop(self.attn.extend(self.ln1(x), cache, step))
        return x + self.drop(self.mlp(self.ln2(x)))


class KVCache:
    """What decoding keeps: every layer's keys and values and the tokens, in `capacity` slots for each
    of the batch's sequences. Sequence b's token in slot t is at position t - start[b]: a left-padded
    batch starts its shorter prompts later, so that every sequence's newest token is in slot
    length - 1 (`length`: the slots in use)."""

    def __init__(self, layers: list[LayerCache], tokens: torch.Tensor):
        self.layers, self.tokens, self.length = layers, tokens, 0
        self.start = torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1]

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]


class LM(nn.Module):
    """Pre-LayerNorm GPT-style decoder with tied embeddings and no absolute positions: all position
    information comes from the attention method, so the model runs at any length."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        shared: dict = {}  # parts shared across layers (the T5 bias table, one for every T5 layer of a layout)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # each layer its own config: its method and window of model.layers (attention.layouts)
        self.blocks = nn.ModuleList(Block(c, shared, i) for i, c in enumerate(layer_configs(cfg, cfg.layers, cfg.n_layer)))
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

    def hidden(self, idx: torch.Tensor, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        check_segments(doc_ids, *idx.shape)
        x = self.wte(idx)
        pos = None if doc_ids is None else positions(doc_ids)  # each token's position in its document
        memo: dict = {}  # what the layers share in this forward (a query temperature's table)
        for block in self.blocks:
            x = block(x, segments=doc_ids, positions=pos, memo=memo)
        return self.ln_f(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, doc_ids: torch.Tensor | None = None):
        """idx [B, T] -> (logits [B, T, vocab], the next-token loss on targets or None). doc_ids [B, T]:
        a document id per token (attention.masks.document_ids makes them from a packed batch's EOS
        tokens); no token attends across a document boundary, and each token's position is its
        offset in its document (attention.masks.positions): a packed window's logits are those of
        its documents run one by one."""
        logits = self.lm_head(self.hidden(idx, doc_ids))
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
    # forward over the tokens so far. A batch of prompts of different lengths is left-padded: each
    # prompt is read alone, and the rows of a decode step take each sequence's own positions, with
    # its padding masked (attention.cache.cached_attention).

    @property
    def device(self) -> torch.device:
        """Where the weights are (generation's readers name theirs the same way)."""
        return self.wte.weight.device

    @property
    def halo(self) -> int:
        """Positions before the newest whose outputs change when a token is appended."""
        return max(b.attn.processor.halo if b.attn.processor is not None else 0 for b in self.blocks)

    def new_cache(self, batch: int, capacity: int, device=None, dtype=None) -> KVCache:
        """An empty cache for `batch` sequences of up to `capacity` slots (prompt, its padding and the
        generated tokens)."""
        for b in self.blocks:
            if not b.attn.cfg.causal or (b.attn.processor is not None and b.attn.processor.leak):
                raise ValueError(f"{b.attn.spec.name} sees future keys here (non-causal, or DAPE V2 leak=True), "
                                 "so it cannot decode token by token")
        p = self.wte.weight
        device = p.device if device is None else device
        dtype = p.dtype if dtype is None else dtype
        shape = (batch, self.cfg.n_head, self.cfg.d_model // self.cfg.n_head)
        layers = []
        for b in self.blocks:
            size = self._ring_size(b.attn)
            # a layer whose processor reads earlier queries' scores (MTA) keeps its slots' queries too,
            # and every layer what it keeps per slot beside them (FoX's extras); a windowed one in a ring
            kept = dict(key_dim=b.attn.key_dim, extra=b.attn.cache_extra(dtype),
                        keep_q=b.attn.processor is not None and b.attn.processor.q_halo > 0)
            if size:
                layers.append(RingCache(*shape, min(size, capacity), device, dtype, **kept))
            else:
                layers.append(LayerCache(*shape, capacity, device, dtype, **kept))
        return KVCache(layers, torch.zeros(batch, capacity, dtype=torch.long, device=device))

    def _ring_size(self, attn) -> int:
        """The slots a windowed layer keeps (0: no window, every slot): a step's rows (the halo and
        up to RING_ROWS new tokens), MTA's query halo above them (rows whose scores the step
        recomputes), the window before the first and the DAPE conv's reach left of it."""
        if not attn.parts.window:
            return 0
        p = attn.processor
        reach = p.halo + p.q_halo if p is not None else 0
        return self.halo + RING_ROWS + attn.parts.window - 1 + reach

    def prefill(self, idx: torch.Tensor, cache: KVCache, lengths=None, progress=None) -> torch.Tensor:
        """Read the prompts idx [B, T] into an empty cache with the usual forward (the planner's
        backends) -> logits of each prompt's last position [B, vocab]. lengths [B] (default: all T)
        makes idx a left-padded batch: prompt b is idx[b, T - lengths[b]:]. The prompts of one
        length are read together and each length on its own, so every prompt is read as it is
        alone. progress(done, total), if given, hears every layer of every length read."""
        if cache.length:
            raise ValueError("prefill needs an empty cache; append tokens with decode()")
        B, T = idx.shape
        if T > cache.capacity:
            raise ValueError(f"a prompt of {T} tokens does not fit a cache of {cache.capacity}")
        if B != cache.batch:
            raise ValueError(f"{B} prompts for a cache of {cache.batch} sequences")
        lengths = [T] * B if lengths is None else [int(n) for n in lengths]
        if len(lengths) != B or not all(1 <= n <= T for n in lengths):
            raise ValueError(f"lengths must be {B} numbers in 1..{T}, got {lengths}")
        groups: dict[int, list[int]] = {}
        for b, n in enumerate(lengths):
            groups.setdefault(n, []).append(b)
        logits, done, total = None, 0, len(groups) * len(self.blocks)
        for n, rows in sorted(groups.items()):
            whole = len(rows) == B  # every prompt this long: the whole batch, no gather
            x = self.wte(idx[:, T - n:] if whole else idx[rows, T - n:])
            memo: dict = {}
            for block, layer in zip(self.blocks, cache.layers):
                x = block(x, layer, None if whole else rows, T - n, memo=memo)
                done += 1
                if progress is not None:
                    progress(done, total)
            out = self.lm_head(self.ln_f(x[:, -1]))
            if whole:
                logits = out
            else:
                logits = out.new_empty(B, out.shape[-1]) if logits is None else logits
                logits[rows] = out
        pad = torch.tensor([T - n for n in lengths], device=idx.device)
        cache.tokens[:, :T] = idx.masked_fill(torch.arange(T, device=idx.device)[None, :] < pad[:, None], 0)
        cache.start.copy_(pad)
        cache.length = T
        return logits

    def decode(self, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Append tokens idx [B, m] (usually m = 1) -> logits of the new positions [B, m, vocab]: their
        rows of a full forward over all the tokens so far of each sequence (so the last is the next
        token's distribution). O(T) per layer and token; the shapes grow with the cache (see
        static_step for one that does not)."""
        n, m = cache.length, idx.shape[1]
        if n + m > cache.capacity:
            raise ValueError(f"the cache holds {cache.capacity} tokens; {n + m} do not fit")
        # a windowed layer's ring holds RING_ROWS new rows a step: more go in pieces, and a piece's
        # halo rows, recomputed by the next, are taken from the next
        size = RING_ROWS if any(layer.ring for layer in cache.layers) else m
        out = None
        for i in range(0, m, size):
            first, logits = self._append(idx[:, i:i + size], cache)
            keep = logits[:, max(0, n - first):]
            out = keep if out is None else torch.cat([out[:, :max(0, first - n)], keep], 1)
        return out

    def _append(self, idx: torch.Tensor, cache: KVCache) -> tuple[int, torch.Tensor]:
        """Append idx [B, m] -> (the first row computed, the logits of rows first..length-1)."""
        n, m = cache.length, idx.shape[1]
        cache.tokens[:, n:n + m] = idx
        first = max(0, n - self.halo)
        # every row a new token of a sequence that holds one already: none is padding
        step = StepRows(torch.arange(first, n + m, device=idx.device), cache.start, n + m, n + m,
                        rows_real=first == n and n > 0, grows=True)
        x = self.wte(cache.tokens[:, first:n + m])
        for block, layer in zip(self.blocks, cache.layers):
            x = block.extend(x, layer, step)
        cache.length = n + m
        return first, self.lm_head(self.ln_f(x))

    def static_step(self, token: torch.Tensor, cache: KVCache, pos: torch.Tensor) -> torch.Tensor:
        """Append one token per sequence (token [B]) in slot `pos` (a 0-d long tensor on the device,
        at least `halo`) -> the next token's logits [B, vocab], as decode() gives them. Every shape
        is the same at every slot: the halo rows before pos and pos itself against all `capacity`
        slots, those past pos masked. No host sync and no branch on data, so a CUDA graph captures
        it (model.decoding.StaticDecoder). Neither pos nor cache.length advances here."""
        cache.tokens.index_copy_(1, pos.view(1), token[:, None])
        rows = pos - self.halo + torch.arange(self.halo + 1, device=pos.device)
        # without a halo the one row is the new token, past every sequence's first (none is padding)
        step = StepRows(rows, cache.start, pos + 1, cache.capacity, rows_real=self.halo == 0)
        x = self.wte(cache.tokens.index_select(1, rows))
        for block, layer in zip(self.blocks, cache.layers):
            x = block.extend(x, layer, step)
        return self.lm_head(self.ln_f(x[:, -1]))

    def layout(self) -> list[dict]:
        """Each layer's method and window (0: global), as meta.json records them."""
        return [{"method": b.attn.spec.name, "window": b.attn.cfg.window} for b in self.blocks]

    def backends(self, device: torch.device, segments: bool = False) -> list[str]:
        """Each layer's backend on `device`, for calls with document ids when `segments`."""
        return [block.attn.backend_for(device, segments) for block in self.blocks]

    def backend_notes(self, device: torch.device, segments: bool = False) -> list[str]:
        """Why a layer's backend is not the fused kernels that would run it unmasked (a window, or
        document ids when `segments`), once each."""
        notes = (plan_note(replace(block.attn.parts, segments=segments), device, block.attn.cfg.backend)
                 for block in self.blocks)
        return list(dict.fromkeys(n for n in notes if n))

    def kernels(self) -> list[str | None]:
        """The fused kernel each layer's DAPE V2 processor last ran (None: none, or no such choice)."""
        return [getattr(block.attn.processor, "kernel", None) for block in self.blocks]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
