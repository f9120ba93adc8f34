"""RoPE's rotation of q and k: reference.py (plain PyTorch, the definition) and triton.py (q and k
rotated in one fused launch, forward and backward; imported lazily so this package imports without
triton)."""
