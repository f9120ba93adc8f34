"""Evaluation of trained runs: perplexity at every length with the DAPE V2 paper's protocol and ΔP
(evaluate.py), retrieval at length (retrieval.py: passkey, copy), the attention maps of one input
(attention_maps.py), and the evaluation files a run keeps (files.py: eval.json and the earlier
evaluations kept beside it).

Imports: lenx.runs (a run's config, weights and corpus), lenx.model, lenx.attention (score maps),
lenx.config and the leaf utilities; never the trainer, reports or the CLI. files.py imports only
lenx.fileio, so reports and plots can read evaluation files without loading a model.
"""
