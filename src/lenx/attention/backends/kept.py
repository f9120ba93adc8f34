"""The tables the fused kernels keep between calls (ops.biased_softmax.bands: Kerple's and ALiBi's
bands; ops.dape_v2.tables: DAPE V2's host tables) are forgotten after every optimizer step.

Those caches key on each source tensor's _version, which an in-place update bumps; torch's fused
optimizers (AdamW(fused=True), lenx's default on CUDA) write the parameters without bumping it. So
without this a Kerple layer trained on the fused kernels kept the bands of its first step for the
whole run (its parameters moved, its forward did not follow), and DAPE V2's validation forwards
kept the tables of the first one. The hook is global (torch.optim's step post-hook): it covers any
torch optimizer in any training loop, at the cost of one rebuild per layer after each step."""

import sys

from torch.optim.optimizer import register_optimizer_step_post_hook

CACHES = ("lenx.ops.biased_softmax.bands", "lenx.ops.dape_v2.tables")


def forget(*_):
    """Empties the caches of CACHES that are loaded (an optimizer step post-hook's signature)."""
    for name in CACHES:
        module = sys.modules.get(name)
        if module is not None:
            module.clear()


register_optimizer_step_post_hook(forget)
