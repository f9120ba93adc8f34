"""Attention's share of a profiled training step: profiler ranges around every attention call.

`with attention_ranges():` every Attention.forward marks its attention computation (the backend call
and the normaliser's finish; not the q/k/v and output projections, nor RoPE's rotation of q and k)
for torch.profiler:

- FORWARD ("lenx.attention.forward"): a record_function range around the forward computation;
- BACKWARD ("lenx.attention.backward"): a range that the backward of an identity autograd Function
  on the attention's output opens and that of an identity Function on its (q, k, v) closes.

The backward range holds exactly that computation's backward: the autograd engine runs, of the ready
nodes, the one created last (the highest sequence number) first. When the output marker runs, no
ready node was created after it (that one would have run first); the attention's nodes, created
between the two markers, then outrank every ready node outside, and none of them waits on one
(their gradients come from nodes created after them: theirs or the output marker's); the input
marker runs only once they all have. (tests/test_profiling.py checks it on the CPU for each backend
that runs there. It assumes one device's backward thread and no reentrant checkpointing, as in
lenx's training step.)

Off (the default) Attention.forward adds nothing: no range, no autograd node.

attention_profile(events, kernels) reads a profile's events: the total time of the device's kernels
(or, on a CPU, the self time of the CPU ops) and the part of it under each kind of range, per item name,
and the rest (outside every attention range) per item name and thread.
"""

import bisect
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.autograd import DeviceType
from torch.profiler import record_function

FORWARD = "lenx.attention.forward"
BACKWARD = "lenx.attention.backward"

_active = False


def active() -> bool:
    """Whether attention_ranges() is on (Attention.forward asks before it marks anything)."""
    return _active


@contextmanager
def attention_ranges(on: bool = True):
    """Mark every attention computation for torch.profiler while this is open (process-wide)."""
    global _active
    before, _active = _active, on
    try:
        yield
    finally:
        _active = before


class _Span:
    """The backward range of one attention call, open between its two markers' backward."""

    record = None


class _OpenBackward(torch.autograd.Function):
    """Identity on the attention's output; its backward opens the BACKWARD range."""

    @staticmethod
    def forward(ctx, span, out):
        ctx.span = span
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        ctx.span.record = torch.ops.profiler._record_function_enter_new(BACKWARD, None)
        return None, grad


class _CloseBackward(torch.autograd.Function):
    """Identity on the attention's (q, k, v); its backward, the last of that attention's, closes
    the BACKWARD range."""

    @staticmethod
    def forward(ctx, span, q, k, v):
        ctx.span = span
        return q.view_as(q), k.view_as(k), v.view_as(v)

    @staticmethod
    def backward(ctx, gq, gk, gv):
        span = ctx.span
        if span.record is not None:
            torch.ops.profiler._record_function_exit._RecordFunction(span.record)
            span.record = None
        return None, gq, gk, gv


def marked(attend, q, k, v):
    """attend(q, k, v) -> out, inside the FORWARD range and, when a backward will run, between the
    two markers of the BACKWARD range."""
    track = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if track:
        span = _Span()
        q, k, v = _CloseBackward.apply(span, q, k, v)
    with record_function(FORWARD):
        out = attend(q, k, v)
    return _OpenBackward.apply(span, out) if track else out


# --- reading a profile ------------------------------------------------------------------------------


@dataclass
class AttentionProfile:
    """Times in microseconds over the whole profile: all work (total_us), the work under each kind of
    range, and kernels linked to no CPU event (in total_us only; 0 when the profiler linked every
    kernel). `by_name[kind]`: {name: [us, count]}. `outside`: {(name, pass): [us, count]} for the work
    in no attention range, pass "bwd" when its launcher ran on a thread with backward ranges only (the
    autograd engine's device thread), "fwd" on one with forward ranges only (the forward, the loss and
    the optimizer step), "-" where one thread ran both (a CPU) or neither."""

    total_us: float = 0.0
    unlinked_us: float = 0.0
    forward_us: float = 0.0
    backward_us: float = 0.0
    ranges: dict = field(default_factory=lambda: {FORWARD: 0, BACKWARD: 0})
    by_name: dict = field(default_factory=lambda: {FORWARD: {}, BACKWARD: {}})
    outside: dict = field(default_factory=dict)


def _items(events, kernels: bool):
    """([(name, us, the CPU event that ran or launched it)] for every unit of work, each once; the
    total time of all that work (for kernels, those linked to a CPU event may be fewer)).

    kernels=True: the device's activities (kernels, memcpy, memset) at their own duration. The
    profiler links each one to the CPU op (or range) that launched it and lists it in that event's
    `kernels`. Those lists also hold the device-side copies of user ranges (a range's span on the
    GPU, gaps included), and a kernel can be listed twice where two CPU events share a correlation
    id (seen: "Activity Buffer Request" and an aten op, torch 2.11): so an entry counts only as the
    claim on a device event of that name and duration not yet claimed, each device event once.
    kernels=False: every CPU op and range at its self time (the time in no op nested in it), itself
    as its launcher; with no GPU this is the CPU's work."""
    cpu = [e for e in events if e.device_type == DeviceType.CPU and not e.is_async]
    if not kernels:
        return [(e.name, e.self_cpu_time_total, e) for e in cpu], sum(e.self_cpu_time_total for e in cpu)
    device = [e for e in events if e.device_type != DeviceType.CPU and not e.is_user_annotation]
    unclaimed = Counter((e.name, e.time_range.elapsed_us()) for e in device)
    items = []
    for e in cpu:
        for k in e.kernels:
            if unclaimed[k.name, k.duration] > 0:
                unclaimed[k.name, k.duration] -= 1
                items.append((k.name, k.duration, e))
    return items, sum(e.time_range.elapsed_us() for e in device)


def attention_profile(events, kernels: bool) -> AttentionProfile:
    """Split a profile's work (see _items) by the attention range its CPU event started in: an item
    belongs to FORWARD or BACKWARD when its launching op started inside such a range on the same
    thread (a kernel launched by the range itself, say a Triton kernel, included)."""
    result = AttentionProfile()
    spans = {}  # thread -> [(start, end, kind)] by start; the ranges of one thread never overlap
    for e in events:
        if e.name in (FORWARD, BACKWARD) and e.device_type == DeviceType.CPU:
            result.ranges[e.name] += 1
            spans.setdefault(e.thread, []).append((e.time_range.start, e.time_range.end, e.name))
    for ranges in spans.values():
        ranges.sort()
    passes = {thread: {kind for _, _, kind in ranges} for thread, ranges in spans.items()}
    items, result.total_us = _items(events, kernels)
    result.unlinked_us = result.total_us - sum(us for _, us, _ in items)
    for name, us, launcher in items:
        ranges = spans.get(launcher.thread, [])
        t = launcher.time_range.start
        i = bisect.bisect_right(ranges, (t, float("inf"))) - 1
        if i < 0 or t > ranges[i][1]:
            kinds = passes.get(launcher.thread, set())
            where = {frozenset([FORWARD]): "fwd", frozenset([BACKWARD]): "bwd"}.get(frozenset(kinds), "-")
            entry = result.outside.setdefault((name, where), [0.0, 0])
            entry[0] += us
            entry[1] += 1
            continue
        kind = ranges[i][2]
        if kind == FORWARD:
            result.forward_us += us
        else:
            result.backward_us += us
        entry = result.by_name[kind].setdefault(name, [0.0, 0])
        entry[0] += us
        entry[1] += 1
    return result
