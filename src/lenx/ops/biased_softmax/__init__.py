"""Causal softmax attention with a per-distance bias table (ALiBi, Kerple, T5, or none):
reference.py (dense, the definition) and triton.py (fused kernels, imported lazily so this
package imports without triton; band.py holds their bias band and tile shapes, bands.py a table's
bands kept between calls, backward.py their backward kernels):

    lenx.ops.biased_softmax.reference.biased_softmax_reference(q, k, v, table, window=, segments=)
    lenx.ops.biased_softmax.triton.biased_attention(q, k, v, table, kerple=, tail=, window=, segments=, bands=)

The same kernels run FoX's bias c_i - c_j (lenx.ops.forgetting).
"""
