"""Multi-Token Attention (arXiv 2504.00927): reference.py (dense, the definition, and a loop form of
the same formula for small T), conv.py (the query-key convolution in Triton, forward and backward;
imported lazily, so this package imports without triton) and route.py (which of the two convolves):

    lenx.ops.mta.reference.mta_scores(logits, kernel, pre_mix, q_pos, k_pos, key_valid)
    lenx.ops.mta.reference.mta_probs(probs, allowed, kernel, post_mix, context)
    lenx.ops.mta.reference.mta_loops(q, k, v, ...)
    lenx.ops.mta.conv.mta_conv(x, kernel)             reference._conv(x, kernel) in Triton
    lenx.ops.mta.route.score_conv(x, kernel, documents)
"""
