"""lenx: a length-extrapolation lab for Transformer attention."""

from ._memory import pin_mmap_threshold

__version__ = "0.1.0"

pin_mmap_threshold()
