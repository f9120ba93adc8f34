"""What the parts of an attention declare about themselves, and the composition the backends run.

A bias maps (q_pos, k_pos, q, k) to an additive [H or B*H, Tq, Tk] bias; a processor maps the score
block to processed scores, all processors with one signature; a normaliser turns scores into an
output (Softmax, StickBreaking). The backends decide what they can run from these declarations,
never by probing for attributes or types.
"""

from dataclasses import dataclass
import functools

from torch import nn


class ScoreBias(nn.Module):
    """An additive score bias: forward(q_pos, k_pos, q, k) -> [H, Tq, Tk] (or [B, H, Tq, Tk]) for
    positions q_pos [Tq], k_pos [Tk], or [B, H, Tq, Tk] for positions per sequence [B, Tq], [B, Tk]
    (a left-padded batch, whose padding has negative positions). per_distance: it depends only on
    (head, i - j) and gives a [H, 2T - 1] table (DistanceBias): FlexAttention and the fused kernels
    read that table. per_token: it reads per-token values of the layer's input (FoX's forget gates),
    so the attention module binds it to them (bind) and the backends run the bound bias; the parts
    the planner judges hold it unbound."""

    per_distance = False
    per_token = False
    absolute = False  # reads a position itself, not only i - j: under document segments it takes each token's (at)

    def at(self, positions) -> "ScoreBias":
        """This bias read at per-token positions [B, T] of one forward (a document's offsets): a
        backend's block positions index them. A bias of i - j alone is itself (masks.py)."""
        return DocumentPositions(self, positions) if self.absolute else self

    def fused_grad_args(self) -> dict:
        """Keyword arguments of lenx.ops.biased_softmax.triton.biased_attention that let the fused
        kernel give this bias's parameters their gradients more cheaply than through the whole
        table gradient (`kerple`, `tail`); none by default."""
        return {}

    def token_values(self):
        """c [B, H, T] when this bias is c_i - c_j of per-token values of one forward at positions
        0..T-1 (FoX's, bound to its input), which the fused FoX kernel reads; None otherwise."""
        return None


class DocumentPositions(ScoreBias):
    """An absolute bias bound to per-token positions [B, T]: [B, H, Tq, Tk] for block positions q_pos, k_pos."""

    def __init__(self, bias: ScoreBias, positions):
        super().__init__()
        self.bias, self.positions = bias, positions

    def forward(self, q_pos, k_pos, q=None, k=None):
        return self.bias(self.positions[:, q_pos], self.positions[:, k_pos], q=q, k=k)


class ScoreProcessor(nn.Module):
    """Maps the score block to processed scores: forward(raw, bias, q, q_pos, k_pos, key_valid=None,
    visible=None) -> A, where raw [B, H, Tq, Tk] are the scaled q.k scores, bias the bias part's block (or None),
    q [B, H, Tq, d] the rows' queries, q_pos [Tq] and k_pos [Tk] their positions (or per sequence
    [B, Tq], [B, Tk]), key_valid [B, Tk] the keys that exist (None: all; decoding passes it for a
    padded batch or a fixed-size cache; per row [B, Tq, Tk] under document segments: another
    document's keys do not exist for the row), visible [Tq, Tk] or [B, Tq, Tk] the keys a window or
    document mask leaves each row (None: all; a hidden key is read as one past the causal edge,
    see masks.py). A includes the bias.

    halo: keys past a row block's last query that its processed scores read (the chunked path
    takes that many more). q_halo: query rows before a block's first that its output reads (MTA's
    query convolutions): callers give those rows' q too and drop their outputs; post_halo of them
    (the last ones) go through the softmax too, their probabilities read by after_softmax.
    leak: processed scores see future keys (the causal cut is off). op: the fused op (a folder of
    lenx.ops) that can run this processor, if any. post_softmax: after_softmax(probs, allowed,
    context, key_valid) changes the softmax probabilities before they weight the values and drops
    the first `context` rows (normalise applies it; key_valid per row under document segments). finish(out) maps
    each head's output [B, H, T, d] after the normaliser's own finish."""

    halo = 0
    q_halo = 0
    post_halo = 0
    leak = False
    op: str | None = None
    post_softmax = False

    def after_softmax(self, probs, allowed=None, context: int = 0, key_valid=None):
        return probs[..., context:, :]

    def finish(self, out):
        return out


def normalise(parts: "Parts", scores, v, allowed, context: int = 0, key_valid=None):
    """The normaliser's (out, rem) of processed scores, with the processor's post-softmax step; the
    first `context` rows (at most the processor's post_halo) are read by that step only and give no
    output. key_valid [B, Tq, Tk] under document ids: the keys of each row's document (for that step)."""
    if parts.processor is not None and parts.processor.post_softmax:
        post = functools.partial(parts.processor.after_softmax, allowed=allowed, context=context,
                                 key_valid=key_valid)
        return parts.normaliser(scores, v, allowed, post=post)
    return parts.normaliser(scores, v, allowed)


@dataclass(frozen=True)
class Parts:
    """The parts of one attention after the q/k transform (RoPE is applied before any backend).
    The modules are owned by the attention layer."""

    bias: ScoreBias | None
    processor: ScoreProcessor | None
    normaliser: nn.Module  # Softmax or StickBreaking: .name, .allowed, .forward, .finish
    causal: bool = True
    head_dim: int | None = None  # lets the planner reject shapes a fused kernel cannot take
    key_dim: int | None = None  # q and k's width when it is not head_dim (PoPE's 2d)
    window: int = 0  # each row sees its `window` most recent keys (0: all; masks.py)
    segments: bool = False  # the call carries document ids (set per call: the planner reads it)

    def __post_init__(self):
        if self.window < 0:
            raise ValueError(f"window must be 0 (global) or a number of keys >= 1, got {self.window}")
        if self.window and not self.causal:
            raise ValueError("a window needs a causal attention (it keeps each row's most recent keys)")

    @property
    def masked(self) -> str | None:
        """What masks keys beyond the causal cut ("a window", "document segments"), or None."""
        what = [w for w, on in (("a window", self.window), ("document segments", self.segments)) if on]
        return " and ".join(what) or None


@dataclass
class PartContext:
    """What a part's from_config(ctx) may read to build itself for one attention layer."""

    name: str  # the registry name being built (e.g. "kerple-power", "dape")
    cfg: object  # AttentionConfig
    n_head: int
    head_dim: int
    d_model: int
    shared: dict  # what layers share: parts (the T5 table) and RoPE's table caches
    processor: str | None = None  # the composition's processor name, if any
    has_bias: bool = False  # whether the composition has an additive bias (set before the processor is built)
    layer: int = 0  # the layer's index in the model (MTA convolves on some layers only)
    n_layer: int = 1  # the model's layers
