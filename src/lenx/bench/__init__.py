"""`lenx bench`: what things cost. kernels.py times the attention backends (forward, forward +
backward, peak memory) per method and length against fused SDPA on the GPU; train_step.py times
and profiles whole training steps of a preset model per method (`--train-step`); decode.py times
decode steps per method, context and batch, eager and as a CUDA graph, against transformers' GPT-2
(`--decode`); common.py holds what they share.

Imports: lenx.attention (as a user runs it: the module and the backends' entry points, never a
kernel module of lenx.ops, so a benchmark can change no kernel's settings), lenx.model,
lenx.training's step and optimizer, lenx.config and lenx.runinfo (and transformers for decode.py's
GPT-2); never the trainer, evaluation, reports or the CLI. Its tables are lenx.report.bench_tables.
"""
