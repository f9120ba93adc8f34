"""Attention operators: the ground floor. One folder per op, each with reference.py (plain PyTorch,
the formula: the definition the kernels are tested against) beside its fused kernels:

    biased_softmax/  causal softmax with a per-distance bias table (ALiBi, Kerple, T5, or none)
    forgetting/      forgetting attention (FoX): causal softmax plus c_i - c_j, c per token
    dape_v2/         DAPE V2: softmax over S + Bias + f(tril([S; Bias])), f a 1 x k conv pair
    mta/             Multi-Token Attention: a c_q x c_k conv over (query, key) of the logits, head mixing
    head_dot/        sum over b, t, d of x y per head (SSMax's s_h gradient), by the tensors' strides
    stickbreaking/   stick-breaking attention

_launch.py holds the host helpers the kernel launchers share; tiles.py and fastmath.py the Triton
device helpers. The Triton modules are imported lazily, so `lenx.ops` imports without triton.
Nothing here imports lenx.attention: the attention modules and their backends sit above.
"""


def __getattr__(name):
    # The convenience functions over attention parts live one floor up (lenx.functional); they are
    # still reachable here, resolved on first use, so this package never imports lenx.attention.
    if name in ("stickbreaking_attention", "dape_v2_attention"):
        from .. import functional

        return getattr(functional, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
