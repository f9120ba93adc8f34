"""A small decoder LM that carries any lenx attention (it does not know which)."""

from dataclasses import dataclass
import math

import torch
from torch import nn
from torch.nn import functional as F

from .attention import Attention, AttentionConfig


@dataclass
class LMConfig(AttentionConfig):
    vocab_size: int = 256
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 128
    mlp_ratio: int = 4
    activation: str = "gelu"  # gelu | relu (the CHE encoder uses ReLU)
    dropout: float = 0.0


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

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


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

    def backends(self, device: torch.device) -> list[str]:
        return [block.attn.backend_for(device) for block in self.blocks]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
