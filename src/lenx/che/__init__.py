"""The CHE benchmark (`lenx che`): the length-generalisation protocol of Deletang et al. (2023), as
set up by Ruoss et al. (2023), in protocol.py: its config and presets, the encoder that carries any
lenx method in its bidirectional form, training and testing per task, method and seed, the run log
that resumes and merges, and the outputs (che.json, che.md, che_per_length.png). The tasks
themselves are lenx.tasks.

Imports: lenx.attention, lenx.model (the transformer block, precision), lenx.training.step (the one
training step), lenx.tasks, lenx.report (its table), lenx.config and the leaf utilities; never the
trainer, evaluation or the CLI.
"""
