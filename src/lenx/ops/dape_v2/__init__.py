"""DAPE V2 attention: reference.py (dense, the definition), triton.py (fused kernels, imported lazily
so this package imports without triton) and emulate.py (the planned Hopper forward's tile schedule in
PyTorch, CPU-tested; notes/gluon.md for the Gluon kernel that follows it):

    lenx.ops.dape_v2.reference.dape_v2_reference(q, k, v, w1, b1, w2, b2, table)
    lenx.ops.dape_v2.triton.dape_v2_triton(q, k, v, w1, b1, w2, b2, table)
    lenx.ops.dape_v2.emulate.dape_v2_emulate(q, k, v, w1, b1, w2, b2, table)
"""
