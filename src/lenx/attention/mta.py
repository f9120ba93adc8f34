"""Multi-Token Attention (MTA; Golovneva et al. 2025, arXiv 2504.00927): a c_q x c_k convolution over
(query, key) of each head's pre-softmax logits, head mixing within groups of heads before and/or
after the softmax, a second c_q' x c_k' convolution of the probabilities after the softmax, and a
group norm with a scalar gate on each head's output. The formula is lenx.ops.mta.reference; this
module owns the weights, all initialised as the paper's identity (the model starts as its base
method, up to the group norm).

The defaults are the released configs of facebookresearch/RAM projects/mta (300M to 1B,
configs/*_mta.yaml): c_q = 6, c_k = 11, the key-query convolutions on every 4th layer (layers 2, 6,
10, ... counted from 0, as their mta_layers; a model with fewer than 3 layers convolves on its last),
heads mixed before the softmax (pre_sm_linear_head) and after it (head_kernel_size: all heads, 16 of
16; model.mta_head_group = 0 takes all heads) on every layer: model.mta_head_mix = "both"; the
probabilities convolved after the softmax with c_q' x c_k' = 6 x 11 on the same layers, before the
head mixing (model.mta_post_conv, model.mta_post_query_kernel and _key_kernel); group norm with
scalar gating in every layer (no depth scaling: the paper's ablation finds it worse). Runs saved
before these defaults lack the two keys and load with post-softmax mixing only and no second
convolution (lenx.config.FORMER_DEFAULTS). The post-softmax convolution's rows read the c_q' - 1
probability rows above them, so the query halo grows by as much.

Masks (a window, document ids; see lenx.ops.mta.reference): an entry a mask hides from its row is
zeroed before both convolutions as one past the causal edge, and an output row's convolutions read
no key of another document (nor so another document's rows): a packed document's rows are those of
it run alone.

The convolutions run in Triton on CUDA where they can (lenx.ops.mta.route: no document ids, not under
torch.compile); LENX_MTA_CONV=torch keeps F.conv2d.
"""

import torch
from torch import nn

from ..ops.mta.reference import group_norm, mta_probs, mta_scores
from ..ops.mta.route import score_conv
from .parts import ScoreProcessor

HEAD_MIXES = ("none", "pre", "post", "both")


class MTA(ScoreProcessor):
    def __init__(self, num_heads: int, head_dim: int, query_kernel: int = 6, key_kernel: int = 11,
                 head_group: int = 0, head_mix: str = "both", conv: bool = True, norm: bool = True,
                 d_model: int | None = None, post_kernel: tuple[int, int] | None = (6, 11)):
        """post_kernel: (c_q', c_k') of the post-softmax convolution, on this layer if `conv`; None: none."""
        super().__init__()
        for what, (c_q, c_k) in (("", (query_kernel, key_kernel)), ("post-softmax ", post_kernel or (1, 1))):
            if c_q < 1:
                raise ValueError(f"MTA {what}query kernel must be >= 1, got {c_q}")
            if c_k < 1 or c_k % 2 == 0:
                raise ValueError(f"MTA {what}key kernel must be an odd integer >= 1 (centred on each key), got {c_k}")
        group = head_group or num_heads
        if group < 1 or num_heads % group:
            raise ValueError(f"MTA head group {head_group} does not divide the {num_heads} heads")
        if head_mix not in HEAD_MIXES:
            raise ValueError(f"MTA head mixing must be one of {', '.join(HEAD_MIXES)}, got {head_mix!r}")
        self.num_heads, self.query_kernel, self.key_kernel, self.head_group = num_heads, query_kernel, key_kernel, group
        self.head_mix = head_mix
        self.conv_kernel = self.post_conv_kernel = None
        if conv:
            self.conv_kernel = _identity(num_heads, query_kernel, key_kernel)
            if post_kernel is not None:
                self.post_conv_kernel = _identity(num_heads, *post_kernel)
        eye = torch.eye(group).repeat(num_heads // group, 1, 1)
        self.pre_mix = nn.Parameter(eye.clone()) if head_mix in ("pre", "both") else None
        self.post_mix = nn.Parameter(eye.clone()) if head_mix in ("post", "both") else None
        self.norm_weight = self.gate = None
        if norm:
            self.norm_weight = nn.Parameter(torch.ones(head_dim))
            # the released code's gate: weight ~ N(0, d_model^-1/2) cut at 3 std, bias nn.Linear's own
            self.gate = nn.Linear(head_dim, 1)
            std = (d_model or num_heads * head_dim) ** -0.5
            nn.init.trunc_normal_(self.gate.weight, std=std, a=-3 * std, b=3 * std)

    @classmethod
    def from_config(cls, ctx):
        """The key-query convolution on layers l with l % model.mta_every == model.mta_every // 2 (a
        model too shallow to have one convolves on its last layer); head mixing and the group norm on
        every layer."""
        cfg, first = ctx.cfg, min(ctx.cfg.mta_every // 2, ctx.n_layer - 1)
        conv = ctx.layer >= first and (ctx.layer - first) % cfg.mta_every == 0
        post = (cfg.mta_post_query_kernel, cfg.mta_post_key_kernel) if cfg.mta_post_conv else None
        return cls(ctx.n_head, ctx.head_dim, cfg.mta_query_kernel, cfg.mta_key_kernel, cfg.mta_head_group,
                   cfg.mta_head_mix, conv, cfg.mta_group_norm, ctx.d_model, post)

    @property
    def post_halo(self) -> int:
        """Query rows before a block's first whose probabilities its output reads: c_q' - 1."""
        return self.post_conv_kernel.shape[-2] - 1 if self.post_conv_kernel is not None else 0

    @property
    def q_halo(self) -> int:
        """Query rows before a block's first that its output reads: the query convolution's c_q - 1,
        plus the post-softmax one's c_q' - 1 (whose first rows read c_q - 1 rows above them)."""
        return (self.query_kernel - 1 if self.conv_kernel is not None else 0) + self.post_halo

    @property
    def post_softmax(self) -> bool:
        return self.post_mix is not None or self.post_conv_kernel is not None

    def forward(self, scores: torch.Tensor, bias: torch.Tensor | None = None, q: torch.Tensor | None = None,
                q_pos: torch.Tensor | None = None, k_pos: torch.Tensor | None = None,
                key_valid: torch.Tensor | None = None, visible: torch.Tensor | None = None) -> torch.Tensor:
        """MixPre(Conv2d(Mask_0(S + Bias))) for the scaled scores [B, H, Tq, Tk] (see mta_scores); q is
        not used. Entries after the diagonal (or masked) are left for the normaliser's -inf mask."""
        logits = scores if bias is None else scores + bias.to(scores.dtype)
        # without a convolution nothing reads Mask_0's zeros: the softmax masks those entries itself
        return mta_scores(logits, self.conv_kernel, self.pre_mix, q_pos, k_pos, key_valid, visible, score_conv,
                          mask=False)

    def after_softmax(self, probs: torch.Tensor, allowed: torch.Tensor | None = None, context: int = 0,
                      key_valid: torch.Tensor | None = None) -> torch.Tensor:
        """MixPost(Mask_0(Conv2d_θ'(P))) of the probabilities P [B, H, Tq, Tk] (see mta_probs); the
        first `context` rows are the post-softmax convolution's halo and are dropped; key_valid
        [B, Tq, Tk] under document ids: the keys of each row's document."""
        return mta_probs(probs, allowed, self.post_conv_kernel, self.post_mix, context, key_valid, score_conv)

    def finish(self, out: torch.Tensor) -> torch.Tensor:
        """The group norm and gate of each head's output [B, H, T, d]."""
        if self.norm_weight is None:
            return out
        return group_norm(out, self.norm_weight, self.gate.weight[0], self.gate.bias)

    def extra_repr(self) -> str:
        conv = f"{self.query_kernel}x{self.key_kernel}" if self.conv_kernel is not None else "none"
        post = self.post_conv_kernel
        post = "none" if post is None else f"{post.shape[-2]}x{post.shape[-1]}"
        return (f"heads={self.num_heads}, conv={conv}, post_conv={post}, head_group={self.head_group}, "
                f"head_mix={self.head_mix}, group_norm={self.norm_weight is not None}")


def _identity(num_heads: int, c_q: int, c_k: int) -> nn.Parameter:
    """A [H, 1, c_q, c_k] kernel that is the identity (the paper's initialisation): a 1 at the row's own
    query and the key's own column."""
    kernel = torch.zeros(num_heads, 1, c_q, c_k)
    kernel[:, 0, -1, c_k // 2] = 1.0
    return nn.Parameter(kernel)
