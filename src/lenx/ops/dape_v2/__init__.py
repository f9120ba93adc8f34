"""DAPE V2 attention: reference.py (dense, the definition) and triton.py (fused kernels, imported
lazily so this package imports without triton):

    lenx.ops.dape_v2.reference.dape_v2_reference(q, k, v, w1, b1, w2, b2, table)
    lenx.ops.dape_v2.triton.dape_v2_triton(q, k, v, w1, b1, w2, b2, table)
"""
