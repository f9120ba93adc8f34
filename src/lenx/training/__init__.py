"""Training: the one training step (step.py: forward, loss, accumulation, clipping, optimizer step),
the optimizer and its schedule (optim.py), the run's metrics (metrics.py), the windows each step
reads (batches.py: random draws or one pass, train.sampling; the sequence-length warm-up), the training loop of
`lenx train` with its checkpoints and resumes (loop.py), data parallelism under torchrun
(distributed.py) and `lenx sweep` (sweep.py: train and evaluate several methods on equal terms).

Imports: lenx.model, lenx.runs, lenx.data (the reader), lenx.config and the leaf utilities; sweep.py
also lenx.evaluation and lenx.report, as a sweep evaluates and tabulates its runs. step.py imports
nothing from lenx, so `lenx bench --train-step` and `lenx che` take the same step as `lenx train`.
Nothing outside the CLI's training commands imports loop.py or sweep.py (tests/test_layout.py).
"""
