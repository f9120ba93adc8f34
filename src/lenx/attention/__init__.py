"""Attention variants as composable parts, and the one attention module built from them: one file per
part, parts.py (what parts declare), methods.py (the registry of compositions), module.py (the
Attention module), backends/ (one file per way to compute a composition, and the planner), and
profiling.py (the attention's profiler ranges).

Imports: lenx.ops (the kernels and their references), lenx.config (AttentionConfig) and
lenx._memory; nothing above it (the model, training, evaluation)."""

from .alibi import ALiBi, alibi_slopes
from .backends import BACKENDS, plan_backend
from .cope import CoPE
from .dape import DapeV2
from .fire import FIRE
from .kerple import KerpleLog, KerplePower
from .methods import BASES, MethodSpec, UnknownMethodError, all_methods, parse_method
from .mta import MTA
from .module import Attention, AttentionConfig
from .parts import Parts, PartContext, ScoreBias, ScoreProcessor
from .rope import RoPE
from .softmax import Softmax
from .stickbreaking import StickBreaking
from .t5 import T5Bias
from .xl import XLRelative

__all__ = [
    "ALiBi", "alibi_slopes", "BACKENDS", "Parts", "plan_backend", "CoPE", "DapeV2", "FIRE", "KerpleLog",
    "KerplePower", "BASES", "MethodSpec", "UnknownMethodError", "all_methods", "parse_method", "Attention",
    "AttentionConfig", "PartContext", "ScoreBias", "ScoreProcessor", "RoPE", "Softmax", "StickBreaking", "T5Bias",
    "XLRelative",
]
