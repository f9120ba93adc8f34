"""`lenx bench`: what things cost (kernels.py: the attention backends per method and length, and
whole training steps with --train-step)."""
