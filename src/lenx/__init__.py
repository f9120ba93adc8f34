"""lenx: a length-extrapolation lab for Transformer attention."""

__version__ = "0.1.0"
