"""Multi-Token Attention (arXiv 2504.00927): reference.py (dense, the definition, and a loop form of
the same formula for small T):

    lenx.ops.mta.reference.mta_scores(logits, kernel, pre_mix, q_pos, k_pos, key_valid)
    lenx.ops.mta.reference.mta_probs(probs, allowed, kernel, post_mix, context)
    lenx.ops.mta.reference.mta_loops(q, k, v, ...)
"""
