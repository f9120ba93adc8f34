"""The windows each training step reads (train.sampling), and what a run's steps need of the corpus.

"random": each step draws its windows' starts at random over the whole stream (with replacement).
"pass": one pass over the stream cut into non-overlapping windows (stride seq_len, seq_len + 1 tokens
each, the last token of one the first of the next), each window read once. The windows are taken
in blocks of train.pass_block steps' worth, in stream order, shuffled within each block: steps
s..s+n read one contiguous range of the stream, so a machine needs only the shards of its steps.
Either way the batch of step s is a pure function of (seed, s): a resumed run reads what an
uninterrupted one would, on any number of ranks.

The sequence-length warm-up (train.seq_len_warmup steps from train.seq_len_start, seq_len_at) keeps
all of that: a step reads the same train.seq_len windows as without it, each cut into pieces of the
step's length L (L + 1 tokens, the last of one the first of the next), train.batch_size x seq_len / L
rows. So every step predicts the same tokens, each once, in the same order; only how much context
each prediction has changes.

train.documents: "stream" (the default) reads the windows as they are, attention running across
the EOS between documents. "masked" reads the same windows (the stream holds whole documents, each
followed by its EOS) with a document id per token (document_ids, from the split's document index):
no token attends across a boundary, and positions restart at each document (a window's first
token, maybe mid-document, at 0). An EOS belongs to the document it ends.
"""

from __future__ import annotations

import bisect
from typing import Callable

import numpy as np
import torch

from ..config import ConfigError, TrainConfig
from ..data.shards import ShardedTokens
from . import distributed


class PassOrder:
    """The windows of one pass, in the order steps read them: window w covers tokens
    [w * seq_len, w * seq_len + seq_len + 1)."""

    def __init__(self, n_tokens: int, seq_len: int, batch_size: int, block_steps: int, seed: int):
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.windows = max(0, (n_tokens - 1) // seq_len)
        self.block = block_steps * batch_size  # windows per block; a step's windows lie in one block
        self._perm: tuple[int, np.ndarray] | None = None

    def steps(self) -> int:
        """How many whole steps the pass holds."""
        return self.windows // self.batch_size

    def _block_perm(self, k: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != k:
            size = min(self.block, self.windows - k * self.block)
            self._perm = (k, np.random.default_rng([self.seed, k]).permutation(size))
        return self._perm[1]

    def starts(self, step: int) -> np.ndarray:
        """The token offsets of step `step`'s batch_size windows."""
        first = step * self.batch_size
        if step < 0 or first + self.batch_size > self.windows:
            raise IndexError(f"step {step} is past the {self.steps()} steps of one pass")
        k, within = divmod(first, self.block)
        windows = k * self.block + self._block_perm(k)[within:within + self.batch_size]
        return windows.astype(np.int64) * self.seq_len

    def token_range(self, first_step: int, end_step: int) -> tuple[int, int]:
        """The tokens [a, b) that steps [first_step, end_step) read, whole blocks."""
        if end_step <= first_step:
            return 0, 0
        k0 = first_step * self.batch_size // self.block
        k1 = (end_step * self.batch_size - 1) // self.block
        last = min((k1 + 1) * self.block, self.windows)  # one past the last window read
        return k0 * self.block * self.seq_len, last * self.seq_len + 1


def seq_len_at(t: TrainConfig, step: int) -> int:
    """The length step `step` (from 0) trains at. Without a warm-up, train.seq_len. With one, the
    lengths double from train.seq_len_start: the k lengths below train.seq_len share the first
    train.seq_len_warmup steps equally (step s reads start x 2^floor(s k / warmup)), and from step
    train.seq_len_warmup on the run reads train.seq_len (512 -> 2048 over 305 steps: 512 for steps
    0-152, 1024 for 153-304, 2048 from 305)."""
    if step >= t.seq_len_warmup:
        return t.seq_len
    stages = (t.seq_len // t.seq_len_start).bit_length() - 1
    return t.seq_len_start << (step * stages // t.seq_len_warmup)


class Batches:
    """The batch of step s depends only on (seed, s): resuming at step s reads exactly what an
    uninterrupted run would, on any number of ranks. Each rank takes its slice of every micro-batch.
    `tokens`: an array or a sharded stream (lenx.data.shards.ShardedTokens). `length`: the length
    each step trains at (seq_len_at; default seq_len throughout)."""

    def __init__(self, tokens, seq_len: int, batch_size: int, grad_accum: int, seed: int,
                 info: distributed.DistInfo, split: str = "train", sampling: str = "random", pass_block: int = 64,
                 length: Callable[[int], int] | None = None, doc_starts: np.ndarray | None = None):
        if len(tokens) < seq_len + 2:
            raise ConfigError(f"the {split} split has {len(tokens)} tokens, fewer than train.seq_len + 2")
        micro = batch_size // grad_accum
        if micro % info.world:
            raise ConfigError(f"micro-batch {micro} (batch_size / grad_accum) must divide by the {info.world} ranks")
        self.tokens, self.seq_len, self.seed, self.info = tokens, seq_len, seed, info
        self.batch_size, self.grad_accum, self.micro = batch_size, grad_accum, micro
        self.order = PassOrder(len(tokens), seq_len, batch_size, pass_block, seed) if sampling == "pass" else None
        self.length = length or (lambda step: seq_len)
        self.doc_starts = doc_starts  # train.documents=masked: each document's first token (else None)

    def starts(self, step: int) -> np.ndarray:
        """The token offsets of the global batch of step `step`."""
        if self.order is not None:
            return self.order.starts(step)
        rng = np.random.default_rng([self.seed, step])
        return rng.integers(0, len(self.tokens) - self.seq_len - 1, size=self.batch_size)

    def _rows(self, step: int, micro_index: int) -> np.ndarray:
        """The token offsets of this rank's windows of one micro-batch."""
        rows = self.starts(step)[micro_index * self.micro:(micro_index + 1) * self.micro]
        per_rank = self.micro // self.info.world
        return rows[self.info.rank * per_rank:(self.info.rank + 1) * per_rank]

    def _cut(self, step: int, windows: np.ndarray) -> torch.Tensor:
        """Windows [rows, seq_len + 1] -> the step's pieces (see window)."""
        L = self.length(step)
        if L != self.seq_len:
            pieces = np.lib.stride_tricks.sliding_window_view(windows, L + 1, axis=1)[:, ::L]
            windows = pieces.reshape(-1, L + 1)
        return torch.from_numpy(windows.astype(np.int64))

    def window(self, step: int, micro_index: int) -> torch.Tensor:
        """This rank's rows of one micro-batch: [rows, seq_len + 1] tokens, inputs plus targets; in
        a length warm-up [rows x seq_len / L, L + 1], each window cut into its pieces in order."""
        rows = self._rows(step, micro_index)
        return self._cut(step, np.stack([self.tokens[s:s + self.seq_len + 1] for s in rows]))

    def documents(self, step: int, micro_index: int) -> torch.Tensor | None:
        """The document ids of window()'s input tokens [rows, L] (None for train.documents=stream)."""
        if self.doc_starts is None:
            return None
        ids = document_ids(self.doc_starts, self._rows(step, micro_index), self.seq_len + 1)
        return self._cut(step, ids)[:, :-1]

    def get(self, step: int, micro_index: int, device) -> tuple[torch.Tensor, ...]:
        """(inputs, targets) of one micro-batch, and their document ids for train.documents=masked."""
        window = self.window(step, micro_index).to(device, non_blocking=True)
        ids = self.documents(step, micro_index)
        if ids is None:
            return window[:, :-1], window[:, 1:]
        return window[:, :-1], window[:, 1:], ids.to(device, non_blocking=True)


def document_ids(doc_starts: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """[rows, length]: the index of the document that holds each token of the windows of `length`
    tokens at `starts`, documents starting at doc_starts (ascending; a document's EOS is its last
    token). A token before the first document start (none in a prepared split) is document -1."""
    tokens = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(length)
    return np.searchsorted(doc_starts, tokens, side="right") - 1


def epochs(t: TrainConfig, train_tokens: int) -> float:
    """The passes a run of train.steps steps makes over a train split of `train_tokens` tokens: the
    tokens its windows predict over the split's. Exact for pass sampling (at most 1); the expected
    number of times each token is read for random sampling."""
    return t.steps * t.batch_size * t.seq_len / max(train_tokens, 1)


def sampling_record(t: TrainConfig, corpus) -> dict:
    """What meta.json records of the run's data: sampling, epochs and what they mean, the split's size,
    and train.documents."""
    n = corpus.manifest["splits"]["train"]["tokens"]
    kind = "exact: each window of one pass read once" if t.sampling == "pass" else \
        "expected: windows drawn at random with replacement"
    return {"sampling": t.sampling, "epochs": round(epochs(t, n), 6), "epochs_are": kind, "train_tokens": n,
            "documents": t.documents}


def train_batches(t: TrainConfig, corpus, info: distributed.DistInfo, first_step: int, end_step: int) -> Batches:
    """The training batches of a run, checked before any work: a pass that holds train.steps steps,
    and, for a sharded train split, every shard that steps [first_step, end_step) read."""
    tokens = corpus.tokens("train")
    batches = Batches(tokens, t.seq_len, t.batch_size, t.grad_accum, t.seed, info, sampling=t.sampling,
                      pass_block=t.pass_block, length=lambda step: seq_len_at(t, step),
                      doc_starts=document_starts(t, corpus, "train"))
    if batches.order is not None:
        check_pass_length(t, corpus, batches.order)
    check_shards_here(t, corpus, batches, first_step, end_step)
    return batches


def document_starts(t: TrainConfig, corpus, split: str) -> np.ndarray | None:
    """The first token of each document of the split for train.documents=masked (None for
    "stream"); a one-line ConfigError when the split has no document boundaries to mask."""
    if t.documents != "masked":
        return None
    docs = corpus.docs(split)
    if len(docs) < 2:
        raise ConfigError(f"train.documents=\"masked\" masks attention at document boundaries, and the {split} "
                          f"split of corpus {corpus.name!r} is {len(docs)} document{'' if len(docs) == 1 else 's'}"
                          f" (no boundaries); prepare it from several documents, or use train.documents=\"stream\"")
    return np.ascontiguousarray(docs[:, 0])


def check_pass_length(t: TrainConfig, corpus, order: PassOrder) -> None:
    """A one-line ConfigError when one pass holds fewer steps than train.steps."""
    if t.steps > order.steps():
        raise ConfigError(
            f"train.sampling=\"pass\" reads each window of the train split once, and corpus {corpus.name!r} holds "
            f"{order.windows:,} windows of {t.seq_len + 1} tokens ({len(corpus.tokens('train')):,} tokens at stride "
            f"{t.seq_len}): {order.steps():,} steps of train.batch_size {t.batch_size}, fewer than train.steps "
            f"{t.steps:,}; lower train.steps (or train.batch_size), or use a larger corpus")


def needed_shards(t: TrainConfig, corpus, first_step: int, end_step: int, order: PassOrder | None = None) -> list[int]:
    """The indices of the train shards that steps [first_step, end_step) read: those of the steps'
    token range for pass sampling, every shard for random sampling ([] for an unsharded split).
    order: the run's pass order, already checked against train.steps (else built and checked here)."""
    tokens = corpus.tokens("train")
    if not isinstance(tokens, ShardedTokens) or end_step <= first_step:
        return []
    if t.sampling != "pass":
        return list(range(len(tokens.shards)))
    if order is None:
        order = PassOrder(len(tokens), t.seq_len, t.batch_size, t.pass_block, t.seed)
        check_pass_length(t, corpus, order)
    return list(tokens.covering(*order.token_range(first_step, end_step)))


def check_shards_here(t: TrainConfig, corpus, batches: Batches, first_step: int, end_step: int) -> None:
    """A one-line ConfigError naming the train shards that steps [first_step, end_step) read and
    that are absent (or of the wrong size) here."""
    tokens = batches.tokens
    need = needed_shards(t, corpus, first_step, end_step, batches.order)
    absent = [i for i in need if tokens.problem(i) is not None]
    if not absent:
        return
    names = ", ".join(tokens.path(i).name for i in absent[:8]) + (", ..." if len(absent) > 8 else "")
    what = f"{len(absent)} of them {'is' if len(absent) == 1 else 'are'} not here or not whole: {names} " \
           f"(in {tokens.path(absent[0]).parent})"
    if t.sampling != "pass":
        raise ConfigError(f"train.sampling=\"random\" draws windows from the whole train split, so it needs all "
                          f"{len(need)} train shards of corpus {corpus.name!r}; {what}; copy them, or train with "
                          f"train.sampling=\"pass\"")
    # The last step these shards reach: steps [first_step, reach) read none of the absent ones.
    order, stop = batches.order, tokens.starts[absent[0]]
    reach = first_step + bisect.bisect_right(range(first_step + 1, end_step + 1), stop,
                                             key=lambda e: order.token_range(first_step, e)[1])
    until = f"; or train only the steps the shards here hold: --until {reach}" if reach > first_step else ""
    raise ConfigError(f"steps {first_step}:{end_step} of this run read train shards {need[0]}-{need[-1]} of corpus "
                      f"{corpus.name!r} (train.pass_block {t.pass_block}); {what}; copy them "
                      f"(scripts/data/shards_for_steps.py RUN --steps {first_step}:{end_step} lists them){until}")
