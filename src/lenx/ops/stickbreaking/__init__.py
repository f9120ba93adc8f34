"""Stick-breaking attention: reference.py (dense fp32, the definition) and triton.py (fused kernels,
imported lazily so this package imports without triton)."""
