"""The one training step of lenx: `lenx train`, `lenx bench --train-step` and `lenx che` all take
their optimizer steps here, and nothing else in lenx calls backward() on a loss."""

from contextlib import nullcontext
import math
from typing import Callable, ContextManager, Sequence

import torch


class NonFiniteLoss(FloatingPointError):
    """The step's loss is not finite; the optimizer did not apply its gradients."""

    def __init__(self, loss: float):
        super().__init__(f"the loss became {loss}")
        self.loss = loss


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Sequence[tuple],
               loss_fn: Callable[..., torch.Tensor], *, clip: float,
               autocast: Callable[[], ContextManager] = nullcontext,
               grad_sync: Callable[[bool], ContextManager] | None = None,
               reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
               check_finite: bool = False,
               before_update: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over the micro-batches `batches` (each a tuple of `loss_fn`'s arguments):
    the gradient of their mean loss, accumulated one micro-batch at a time, its norm clipped to
    `clip`, then the optimizer's update; the gradients are cleared (set to None) afterwards.

    autocast: the context each forward (loss_fn) runs in. grad_sync(last): the context of each
    micro-batch's forward under data parallelism (lenx.training.distributed.grad_sync: gradients reduced
    across ranks with the last one only). reduce: applied to the loss before it is checked and
    returned (the mean over ranks). check_finite: raise NonFiniteLoss, before the update, when the
    loss is not finite (this reads it on the host, which waits for the device). before_update: called
    once the gradients are complete, before anything changes the model or the optimizer (up to there
    the step can be abandoned with the model as it was).

    Returns the loss (the mean over the micro-batches, detached) and the gradient norm before clipping."""
    n = len(batches)
    sync = grad_sync or (lambda last: nullcontext())
    loss = None
    for i, batch in enumerate(batches):
        with sync(i == n - 1), autocast():
            micro = loss_fn(*batch)
        if n > 1:  # one micro-batch needs no division (it would be exact, but a kernel)
            micro = micro / n
        micro.backward()
        loss = micro.detach() if loss is None else loss + micro.detach()
    if reduce is not None:
        loss = reduce(loss)
    if check_finite and not math.isfinite(value := float(loss)):
        raise NonFiniteLoss(value)
    if before_update is not None:
        before_update()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, grad_norm
