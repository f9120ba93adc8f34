"""CoPE (Golovneva et al. 2024): contextual positions counted by gates on the scores."""

import torch
from torch import nn

from .parts import ScoreProcessor


class CoPE(ScoreProcessor):
    """g_ij = sigmoid(S_ij) on the causal part; p_ij = sum_{t=j..i} g_it, clamped to npos_max - 1;
    z_ij = q_i . e[p_ij], interpolated between floor(p) and ceil(p); A = S + z.
    e [d, npos_max] is zero-initialised, one per layer, shared by the heads."""

    def __init__(self, head_dim: int, npos_max: int = 64):
        super().__init__()
        self.npos_max = npos_max
        self.pos_emb = nn.Parameter(torch.zeros(head_dim, npos_max))

    @classmethod
    def from_config(cls, ctx):
        return cls(ctx.head_dim, ctx.cfg.cope_npos)

    def forward(self, scores, bias, q, q_pos, k_pos, key_valid=None, visible=None):
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        counted = (k_pos[..., None, :] <= q_pos[..., :, None]).unsqueeze(-3)  # [1 or B, 1, Tq, Tk]
        if key_valid is not None:  # a padded batch or a fixed-size cache: keys that do not exist count nothing
            counted = counted & (key_valid[:, None] if key_valid.dim() == 3 else key_valid[:, None, None, :])
        if visible is not None:  # a window or another document: no gate counted, as past the causal edge
            counted = counted & visible.unsqueeze(-3)
        gates = torch.sigmoid(scores).masked_fill(~counted, 0.0)
        # Reverse cumulative sum along keys: p_ij = sum over t >= j of the (masked) gates of row i.
        pos = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=self.npos_max - 1)
        logits = torch.matmul(q, self.pos_emb.to(q.dtype))  # [B, H, Tq, npos]
        lo = pos.floor()
        frac = (pos - lo).to(logits.dtype)
        z_lo = torch.gather(logits, -1, lo.long())
        z_hi = torch.gather(logits, -1, pos.ceil().long())
        return scores + z_lo + frac * (z_hi - z_lo)
