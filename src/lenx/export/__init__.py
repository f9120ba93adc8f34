"""Models out: a trained run as a folder that transformers loads (`lenx export RUN DIR`).

    export_run("runs/x", "exported/")     # config.json, model.safetensors, the code, the tokenizer

folder.py writes and checks the folder; hf.py holds the transformers classes (LenxConfig,
LenxForCausalLM with generate() over lenx's KV cache), which the folder's configuration_lenx.py
and modeling_lenx.py subclass: a loaded folder runs the installed lenx's model.

Imports: lenx.config, lenx.data, lenx.fileio, lenx.model and lenx.runs; transformers only in hf.py,
which is imported when a folder is written or loaded.
"""
