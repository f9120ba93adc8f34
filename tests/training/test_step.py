"""lenx.training.step.train_step, the one training step: accumulated micro-batches give one big
batch's gradient, the gradient is clipped, the loss comes back, and a non-finite loss stops the
step before the update."""

from contextlib import contextmanager

import pytest
import torch

from lenx.config import LMConfig
from lenx.model import LM
from lenx.training.step import NonFiniteLoss, train_step

V, T = 32, 12


class Recorder(torch.optim.SGD):
    """SGD (lr 1) that keeps the gradients it was stepped with."""

    def __init__(self, params):
        super().__init__(params, lr=1.0)
        self.grads = None

    def step(self, closure=None):
        self.grads = [p.grad.clone() for group in self.param_groups for p in group["params"]]
        return super().step(closure)


def model_and_tokens(rows: int = 8):
    torch.manual_seed(0)
    model = LM(LMConfig(method="kerple", vocab_size=V, n_layer=2, n_head=2, d_model=16))
    tokens = torch.randint(0, V, (rows, T + 1))
    return model, tokens


def lm_loss(model):
    return lambda x, y: model(x, y)[1]


def step(model, tokens, micro: int, clip: float = 1e9, **kw):
    """train_step over `tokens` cut into `micro` micro-batches -> (loss, grad norm, the gradients)."""
    optimizer = Recorder(model.parameters())
    batches = [(t[:, :-1], t[:, 1:]) for t in tokens.chunk(micro)]
    loss, norm = train_step(model, optimizer, batches, lm_loss(model), clip=clip, **kw)
    return loss, norm, optimizer.grads


def test_accumulated_micro_batches_give_the_big_batch_gradient():
    model, tokens = model_and_tokens()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    big_loss, big_norm, big = step(model, tokens, micro=1)
    for micro in (2, 4):
        model.load_state_dict(start)
        loss, norm, grads = step(model, tokens, micro=micro)
        torch.testing.assert_close(loss, big_loss, rtol=1e-6, atol=0)
        torch.testing.assert_close(norm, big_norm, rtol=1e-5, atol=0)
        for g, ref in zip(grads, big):
            torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-7)


def test_the_loss_is_the_mean_over_micro_batches_before_the_update():
    model, tokens = model_and_tokens()
    with torch.no_grad():
        expected = [model(t[:, :-1], t[:, 1:])[1] for t in tokens.chunk(4)]
    loss, _, _ = step(model, tokens, micro=4)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, torch.stack(expected).mean(), rtol=1e-6, atol=0)


def test_the_update_is_applied_and_the_gradients_cleared():
    model, tokens = model_and_tokens()
    before = [p.detach().clone() for p in model.parameters()]
    _, _, grads = step(model, tokens, micro=2)
    for p, b, g in zip(model.parameters(), before, grads):
        torch.testing.assert_close(p.detach(), b - g)  # SGD with lr 1
        assert p.grad is None


def test_the_gradient_norm_is_clipped_and_reported_unclipped():
    model, tokens = model_and_tokens()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    _, norm, free = step(model, tokens, micro=2)
    model.load_state_dict(start)
    clip = 0.5 * float(norm)
    _, clipped_norm, clipped = step(model, tokens, micro=2, clip=clip)
    torch.testing.assert_close(clipped_norm, norm)  # the norm before clipping
    assert float(torch.linalg.vector_norm(torch.stack([g.norm() for g in clipped]))) == pytest.approx(clip, rel=1e-5)
    for g, f in zip(clipped, free):
        torch.testing.assert_close(g, f * (clip / float(norm)), rtol=1e-4, atol=1e-8)


def test_contexts_and_reduce():
    """grad_sync is told which micro-batch is the last, autocast wraps every forward, reduce maps the
    loss that is returned."""
    model, tokens = model_and_tokens()
    synced, forwards = [], []

    @contextmanager
    def grad_sync(last):
        synced.append(last)
        yield

    @contextmanager
    def autocast():
        forwards.append(len(synced))  # entered after this micro-batch's grad_sync
        yield

    loss, _, _ = step(model, tokens, micro=4, grad_sync=grad_sync, autocast=autocast,
                      reduce=lambda loss: loss * 0 + 7)
    assert synced == [False, False, False, True]
    assert forwards == [1, 2, 3, 4]
    assert float(loss) == 7


def test_a_non_finite_loss_stops_before_the_update():
    model, tokens = model_and_tokens()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = Recorder(model.parameters())
    ignored = torch.full((tokens.shape[0], T), -100)  # every target ignored: the mean loss is NaN
    with pytest.raises(NonFiniteLoss, match="nan"):
        train_step(model, optimizer, [(tokens[:, :-1], ignored)], lm_loss(model), clip=1.0, check_finite=True)
    assert optimizer.grads is None
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
