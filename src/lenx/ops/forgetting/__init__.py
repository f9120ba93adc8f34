"""Forgetting attention (FoX): causal softmax attention with the data-dependent bias c_i - c_j, c the
prefix sums of each head's log forget gates. reference.py (dense, the definition) and triton.py (the
biased-softmax kernels with the bias read from c, imported lazily so this package imports without
triton):

    lenx.ops.forgetting.reference.forgetting_reference(q, k, v, c)
    lenx.ops.forgetting.triton.forgetting_attention(q, k, v, c)
"""
