"""DAPE V2 attention kernels. The Triton modules are imported lazily (see lenx.ops), so this package
imports without triton installed:

    lenx.ops.dape_v2.triton.dape_v2_triton(q, k, v, processor, table)   fused DAPE V2
    lenx.ops.dape_v2.biased.biased_attention(q, k, v, table)             processor off (bias only)
"""
