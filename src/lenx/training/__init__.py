"""Training: the one training step (step.py), the optimizer and its schedule (optim.py), and the
run's metrics (metrics.py). The step imports nothing from lenx, so `lenx bench --train-step` and
`lenx che` take the same step as `lenx train`; nothing here imports evaluation, plotting or the CLI."""
