"""The warp-specialised forward chain (chain_ws.py) on the CPU: its values and its hand-off protocol.

Values. chain_ws.py computes what chain.py computes (emulate_chain.chain_schedule), in a different
order across windows (which changes no value) and with one more rounding: the conv partition writes
L = S + f in fp16 over S, so the logits are fp16(S + f) + (t2 + g) (chain_schedule(fused_l=True)),
except at keys 0 .. 2h - 1, where L holds f alone and S (kept aside in fp32) is added in the softmax:
there |f - g| has the size of the bias table (~1e3 for ALiBi at T 1000) and fp16(S + f) would cost
up to half an fp16 spacing (0.5 logit).

Protocol. ws_protocol replays the partitions on window names with mbarrier semantics, under random
interleavings: the conv partition waits sready[w % NB] (phase (w // NB) & 1), reads S of window w
from X_(w % NB), writes L over it, arrives on lready[w % NB]; the head partition is four warps (warp
j: heads j, j + 4, j + 8), each writing S of windows 0 .. AHEAD - 1 for its heads (the prologue),
then per window w waiting on lready, reading its heads' L and writing S of window w + AHEAD into the
buffer it just read (if that window exists). The hand-off of S is ONE arrival on sready (count 1),
made by warp 0 after a partition barrier that all four warps reach once their S is stored; without
that barrier warp 0 could hand over a window the others have not written (the `barrier` switch
replays that bug). The kernel's NB and AHEAD are 2 and 2.
"""

import random

from .emulate_chain import chain_schedule

HEAD_WARPS = 4


def chain_ws_schedule(q, k, v, w1, b1, w2, b2, table=None, *, half=None, p_dtype=None):
    """chain_ws.py's values: chain_schedule with L = S + f rounded to the conv dtype (see above)."""
    return chain_schedule(q, k, v, w1, b1, w2, b2, table, half=half, p_dtype=p_dtype, fused_l=True)


class _Barrier:
    """An mbarrier: a phase completes when `count` arrivals have come; wait(parity) passes while the
    number of completed phases has the other parity (a fresh barrier passes parity 1 at once)."""

    def __init__(self, count):
        self.count, self.arrived, self.done = count, 0, 0

    def arrive(self):
        self.arrived += 1
        if self.arrived == self.count:
            self.done, self.arrived = self.done + 1, 0


class _PartitionBarrier:
    """A named barrier of the head partition (bar.sync over its 128 threads): a warp's k-th call
    returns once every warp has made its k-th call."""

    def __init__(self, n):
        self.n, self.arrived = n, {}

    def sync(self, k):
        self.arrived[k] = self.arrived.get(k, 0) + 1
        while self.arrived[k] < self.n:
            yield "blocked"


def ws_protocol(n_windows: int, H: int = 12, n_buffers: int = 2, ahead: int = 2, seed: int = 0,
                barrier: bool = True) -> list:
    """Replay the hand-offs for n_windows windows with one random interleaving (seeded); returns the
    reads as (who, window, what) in the order they happened. AssertionError on a read of the wrong
    window or state, an overwrite of a buffer before its last read, a wait that passes on a phase
    other than the one it means (a producer two phases ahead, or a stale completion), or a deadlock.
    barrier=False: the head partition's arrive without its partition barrier (a bug to catch)."""
    rng = random.Random(seed)
    X = [{} for _ in range(n_buffers)]   # head -> (window, "S" or "L")
    sready = [_Barrier(1) for _ in range(n_buffers)]   # the head partition's one elected arrival
    lready = [_Barrier(1) for _ in range(n_buffers)]
    part = _PartitionBarrier(HEAD_WARPS)
    reads = []

    def wait(bar, w):
        use = w // n_buffers          # this buffer's use number for window w
        while bar.done % 2 == use % 2:  # try_wait.parity on phase use & 1
            yield "blocked"
        assert bar.done == use + 1, f"window {w}: a wait passed with {bar.done} phases completed, meant {use + 1}"

    def conv():
        for w in range(n_windows):
            b = w % n_buffers
            yield from wait(sready[b], w)
            assert all(X[b].get(h) == (w, "S") for h in range(H)), f"conv reads window {w}: {X[b]}"
            reads.append(("conv", w, "S"))
            yield "step"   # the rows take time: others may run between the reads and the writes
            assert all(X[b].get(h) == (w, "S") for h in range(H)), f"window {w}'s S overwritten under the conv"
            for h in range(H):
                X[b][h] = (w, "L")
            lready[b].arrive()
            yield "step"

    def head_warp(j):
        mine = range(j, H, HEAD_WARPS)
        syncs, last_read = 0, -1

        def qk(w):
            nonlocal syncs
            b = w % n_buffers
            for h in mine:   # the buffer's previous window must be read by the conv (L) and by this warp
                assert X[b].get(h) in (None, (w - n_buffers, "L")) and last_read >= w - n_buffers, \
                    f"S of window {w} over unread {X[b].get(h)}"
                X[b][h] = (w, "S")
                yield "step"   # the heads of a warp are written one after another
            if barrier:
                yield from part.sync(syncs)
                syncs += 1
            if j == 0:
                sready[b].arrive()

        for w in range(min(ahead, n_windows)):
            yield from qk(w)
            yield "step"
        for w in range(n_windows):
            b = w % n_buffers
            yield from wait(lready[b], w)
            assert all(X[b].get(h) == (w, "L") for h in mine), f"head warp {j} reads window {w}: {X[b]}"
            reads.append((f"head{j}", w, "L"))
            last_read = w
            yield "step"
            if w + ahead < n_windows:
                yield from qk(w + ahead)
                yield "step"
    actors = [conv()] + [head_warp(j) for j in range(HEAD_WARPS)]
    while actors:
        progressed = False
        for a in rng.sample(actors, len(actors)):
            try:
                state = next(a)
            except StopIteration:
                actors.remove(a)
                progressed = True
                break
            if state == "step":
                progressed = True
                break
        assert progressed, f"deadlock after {len(reads)} reads"
    return reads
