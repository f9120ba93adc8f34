"""Causal softmax attention with a per-distance bias table (ALiBi, Kerple, T5, or none):
reference.py (dense, the definition) and triton.py (fused kernels, imported lazily so this
package imports without triton; band.py their bias band and tile shapes). The same kernels run FoX's
bias (lenx.ops.forgetting):

    lenx.ops.biased_softmax.reference.biased_softmax_reference(q, k, v, table)
    lenx.ops.biased_softmax.triton.biased_attention(q, k, v, table, kerple=, tail=)
"""
