"""Evaluation of trained runs: perplexity at every length with the DAPE V2 paper's protocol and ΔP
(evaluate.py), retrieval at length (retrieval.py: passkey, copy), the attention maps of one input
(attention_maps.py), and the evaluation files a run keeps (files.py: eval.json and the earlier
evaluations kept beside it). The same protocol on any local transformers causal LM (`lenx eval
--hf`): hf.py loads and reads the model, text.py gives corpus windows their bytes and their text in
the model's tokens, hf_eval.py runs it.

Imports: lenx.runs (a run's config, weights and corpus), lenx.data (the corpus reader, for an HF
model's corpus), lenx.model, lenx.attention (score maps), lenx.config and the leaf utilities; never
the trainer, reports or the CLI; transformers only inside hf.py's functions, and lenx.export only
inside hf.py's lenx_classes (a lenx export is read with lenx's own classes). files.py imports only
lenx.fileio, so reports and plots can read evaluation files without loading a model.
"""
