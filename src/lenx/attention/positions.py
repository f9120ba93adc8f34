"""Relative-position helpers shared by the position biases."""

import torch

from .parts import ScoreBias


def relative_distance(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool) -> torch.Tensor:
    """Distance i - j as a [Tq, Tk] long tensor, or [B, Tq, Tk] for positions per sequence
    (q_pos [B, Tq], k_pos [B, Tk]: a left-padded batch).

    Causal: clamped at 0 (entries with j > i are masked or zeroed later, so their value is
    irrelevant, and clamping keeps every bias finite there). Bidirectional: |i - j|.
    """
    return fold_distance(q_pos[..., :, None] - k_pos[..., None, :], causal)


def fold_distance(signed: torch.Tensor, causal: bool) -> torch.Tensor:
    return signed.clamp(min=0) if causal else signed.abs()


def signed_distances(T: int, device=None) -> torch.Tensor:
    """-(T-1) .. T-1: the index range of a per-distance table, entry (i - j) + T - 1."""
    return torch.arange(-(T - 1), T, device=device)


class DistanceBias(ScoreBias):
    """A bias that depends only on (head, i - j): subclasses define from_distance(dist) -> [H, *dist].
    FlexAttention and the fused kernels read such a bias from its per-distance table instead of a
    [T, T] map."""

    per_distance = True
    causal = True

    def from_distance(self, dist: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def table(self, T: int, device=None) -> torch.Tensor:
        """[H, 2T - 1] bias for every signed distance i - j (see signed_distances)."""
        return self.from_distance(fold_distance(signed_distances(T, device), self.causal))

    @property
    def distance_dtype(self) -> torch.dtype | None:
        """The dtype from_distance reads the distance in (None: as distance() gives it): a decode
        step casts the distance once for all its layers."""
        return None

    def distance(self, q_pos, k_pos) -> torch.Tensor:
        """What from_distance reads for rows at q_pos and keys at k_pos: i - j folded (see
        relative_distance); a decode step computes it once for all its layers."""
        return relative_distance(q_pos, k_pos, self.causal)

    def forward(self, q_pos, k_pos, q=None, k=None):
        """[H, Tq, Tk]; [B, H, Tq, Tk] for positions per sequence."""
        return self.from_distance(self.distance(q_pos, k_pos)).movedim(0, -3)
