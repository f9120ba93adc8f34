"""Attention as functions of q, k, v: DAPE V2 and stick-breaking over the attention parts, on any
backend the planner allows (the fused kernels on CUDA, the chunked reference elsewhere).

Also importable from lenx.ops, resolved lazily (the ops sit a floor below lenx.attention)."""

import torch

from .attention.backends import plan_backend, run_backend
from .attention.parts import Parts, ScoreBias
from .attention.softmax import Softmax
from .attention.stickbreaking import StickBreaking


class MapBias(ScoreBias):
    """A given bias map broadcastable to [B, H, T, T], read block by block."""

    def __init__(self, full: torch.Tensor):
        super().__init__()
        self.full = full

    def forward(self, q_pos, k_pos, q=None, k=None):
        return self.full[..., q_pos[0]: q_pos[-1] + 1, k_pos[0]: k_pos[-1] + 1]


def stickbreaking_attention(q, k, v, attend_current: bool = False, backend: str = "auto", chunk_size: int = 256):
    """Stick-breaking attention, q, k, v [B, H, T, d], scale 1/sqrt(d) -> (out, rem):
    out_i = sum_j A_ij v_j, rem_i = 1 - sum_j A_ij (no remainder is added to out)."""
    parts = Parts(None, None, StickBreaking(q.shape[1], q.shape[-1], attend_current, remainder="drop"))
    return run_backend(plan_backend(parts, q.device, backend), q, k, v, parts, chunk_size)


def dape_v2_attention(q, k, v, processor, bias=None, backend: str = "auto", chunk_size: int = 256):
    """Causal softmax attention over DAPE V2-processed scores: softmax(S + Bias + f(tril([S; Bias]))) V.

    q, k, v [B, H, T, d]; processor a lenx.attention.DapeV2; bias None or a tensor broadcastable to
    [B, H, T, T], or a position-bias module of lenx.attention (evaluated block by block)."""
    bias_part = MapBias(bias) if isinstance(bias, torch.Tensor) else bias
    parts = Parts(bias_part, processor, Softmax())
    out, _ = run_backend(plan_backend(parts, q.device, backend), q, k, v, parts, chunk_size)
    return out
