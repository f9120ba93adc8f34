"""The model floor: the decoder LM (lm.py), its config checks that run before any work
(checks.py), the memory a step takes and what the device has (memory.py), its precision
(precision.py), KV-cache generation (generate.py), the fixed-shape decode step and its CUDA graph
(decoding.py) and checkpoints (checkpoint.py).

Imports: lenx.attention, lenx.config and the standard library, numpy, torch and safetensors; never
training, evaluation, reports, benchmarks or the CLI. The one reach upwards is
generate.generate_from_run, which opens a trained run through lenx.runs inside the function.
"""

from .checks import check_config, check_device, with_backend
from .lm import LM
from .memory import check_training_memory, estimate_memory

__all__ = ["LM", "check_config", "check_device", "check_training_memory", "estimate_memory", "with_backend"]
