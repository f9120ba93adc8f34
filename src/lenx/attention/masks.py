"""The mask part: a sliding window and document segments, on top of the causal cut.

window W (model.window; 0 = global): row i sees key j only when 0 <= i - j < W, its W most recent
keys counting itself (stick-breaking without attend_current never takes its own key, so it takes
W - 1). segments [B, T]: a document id per token; no row sees a key of another document. A masked
key is to every part what a key beyond the causal edge is: the softmax and stick-breaking give it
no weight and break no stick at it, CoPE counts no gate there, and the DAPE convolutions read
zeros as its scores and bias (conv1's input there is zero, as tril makes it past the diagonal).
At a window's edge conv1's output is computed from its neighbours and read by conv2, as past the
diagonal; a key of another document is one that does not exist (conv1's output there is zero, as
the zero padding past a sequence's ends), so each document's rows are those of it run alone.
MTA's two convolutions read a masked entry as one past the causal edge too (zero before each), and
to an output row another document's keys do not exist, nor so its rows (lenx.ops.mta.reference).

Positions under segments (document-masked packing, train.documents=masked): each token's position
is its offset in its document (positions). A bias of i - j alone needs nothing more: every pair the
mask leaves has i - j equal to the difference of the two tokens' document positions. What reads a
position itself (RoPE, PoPE, a query temperature, FIRE's normaliser) takes the per-token positions.
"""

import torch


def visible(q_pos, k_pos, window: int = 0, q_seg=None, k_seg=None):
    """The keys each row may see beyond the causal cut: [Tq, Tk] for positions q_pos [Tq], k_pos
    [Tk] (or per sequence [B, Tq], [B, Tk]), [B, Tq, Tk] with segments q_seg [B, Tq], k_seg [B, Tk];
    None when nothing is masked (no window, no segments)."""
    seen = None
    if window:
        seen = (q_pos[..., :, None] - k_pos[..., None, :]) < window
    if q_seg is not None:
        same = same_document(q_seg, k_seg)
        seen = same if seen is None else seen & same
    return seen


def check_segments(segments, batch: int, length: int) -> None:
    """A one-line ValueError unless segments is an integer tensor [batch, length] (or None)."""
    if segments is None:
        return
    if not isinstance(segments, torch.Tensor) or segments.is_floating_point() or segments.is_complex():
        raise ValueError("segments must be an integer tensor of document ids [B, T]")
    if tuple(segments.shape) != (batch, length):
        raise ValueError(f"segments must have the tokens' shape [{batch}, {length}], got {list(segments.shape)}")


def document_ids(tokens: torch.Tensor, eos: int) -> torch.Tensor:
    """Document ids [B, T] of a packed batch tokens [B, T] whose documents end with an `eos` token:
    the number of eos tokens before each position (an eos belongs to the document it ends)."""
    ends = (tokens == eos).long()
    return ends.cumsum(-1) - ends


def positions(segments: torch.Tensor) -> torch.Tensor:
    """Each token's position in its document [B, T] from document ids [B, T]: 0 at the first token of
    each run of equal ids (the first of a row, or one whose id differs from the token before)."""
    T = segments.shape[-1]
    index = torch.arange(T, device=segments.device).expand_as(segments)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[..., 1:] = segments[..., 1:] != segments[..., :-1]
    return index - torch.where(starts, index, 0).cummax(-1).values


def same_document(q_seg, k_seg):
    """[B, Tq, Tk]: row i and key j are of one document."""
    return q_seg[:, :, None] == k_seg[:, None, :]


def key_range(q0: int, q1: int, length: int, window: int, left: int = 0, right: int = 0) -> tuple[int, int]:
    """The keys rows q0..q1-1 read on the chunked path: [lo, hi). A window skips every key more than
    W - 1 before the first row (and `left` more: the DAPE convolution's reach); `right` keys past
    the last row (the convolution's halo). Without a window every key from 0."""
    lo = max(0, q0 - window + 1 - left) if window else 0
    return lo, min(length, q1 + right)
