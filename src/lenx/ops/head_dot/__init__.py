"""Per-head dot products of two [B, H, T, d] tensors, sum over b, t, d of x y -> [H] (SSMax's s_h
gradient): reference.py (plain PyTorch, the definition), triton.py (one launch reading both by their
strides, fp32 products and sums; imported lazily, so this package imports without triton) and
route.py (which of the two runs):

    lenx.ops.head_dot.reference.head_dot(x, y)
    lenx.ops.head_dot.triton.head_dot(x, y)
    lenx.ops.head_dot.route.head_dot(x, y)
"""
