"""The one attention module: a q/k transform, a score bias, a score processor and a normaliser."""

from dataclasses import dataclass

import torch
from torch import nn

from .alibi import ALiBi
from .backends import Parts, plan_backend, run_backend
from .cope import CoPE
from .dape import DapeV2
from .fire import FIRE
from .kerple import KerpleLog, KerplePower
from .methods import parse_method
from .rope import RoPE
from .softmax import Softmax
from .stickbreaking import StickBreaking
from .t5 import T5Bias
from .xl import XLRelative


@dataclass
class AttentionConfig:
    """Every knob of every part; a part reads only its own."""

    method: str = "rope"
    backend: str = "auto"  # auto | dense | chunked | sdpa | flex | triton
    chunk_size: int = 256  # query rows per block on the chunked path
    causal: bool = True  # False for encoders (CHE): biases use |i - j|, DAPE V2 drops the tril
    rope_base: float = 10000.0
    dape_hidden: int = 32  # D
    dape_kernel: int = 3  # k for dapev2 (dape is always k = 1)
    dape_leak: bool = False  # drop the tril: the paper's information-leakage experiment only
    fire_width: int = 32
    fire_L_init: float = 512.0
    fire_activation: str = "auto"  # auto: relu alone, leaky_relu under a DAPE processor
    t5_buckets: int = 32
    t5_max_distance: int = 128
    cope_npos: int = 64
    sb_attend_current: bool = False
    sb_remainder: str = "value"  # value | head | drop


def build_bias(kind: str | None, cfg: AttentionConfig, n_head: int, head_dim: int, d_model: int,
               shared: dict, processor: str | None):
    if kind is None:
        return None
    if kind == "alibi":
        return ALiBi(n_head, cfg.causal)
    if kind == "kerple":
        return KerpleLog(n_head, cfg.causal)
    if kind == "kerple-power":
        return KerplePower(n_head, cfg.causal)
    if kind == "fire":
        act = cfg.fire_activation
        if act == "auto":
            act = "leaky_relu" if processor else "relu"
        return FIRE(n_head, cfg.causal, cfg.fire_width, cfg.fire_L_init, activation=act)
    if kind == "t5":
        # One table for the whole model: the first layer creates it, the others reuse it.
        if "t5" not in shared:
            shared["t5"] = T5Bias(n_head, cfg.causal, cfg.t5_buckets, cfg.t5_max_distance)
        return shared["t5"]
    if kind == "xl":
        return XLRelative(n_head, head_dim, d_model, cfg.causal)
    raise AssertionError(kind)


class Attention(nn.Module):
    def __init__(self, cfg: AttentionConfig, n_head: int, d_model: int, shared: dict | None = None):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model {d_model} is not divisible by n_head {n_head}")
        self.cfg, self.n_head, self.head_dim = cfg, n_head, d_model // n_head
        spec = self.spec = parse_method(cfg.method)
        if not cfg.causal and (spec.normaliser == "stickbreaking" or spec.base == "cope"):
            raise ValueError(f"method {spec.name!r} is causal by construction and cannot run non-causally")
        shared = {} if shared is None else shared
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.rope = RoPE(self.head_dim, cfg.rope_base) if spec.base == "rope" else None
        self.bias = build_bias(spec.bias, cfg, n_head, self.head_dim, d_model, shared, spec.processor)
        if spec.processor:
            k = 1 if spec.processor == "dape" else cfg.dape_kernel
            self.processor = DapeV2(n_head, cfg.dape_hidden, k, with_bias=self.bias is not None, leak=cfg.dape_leak)
        elif spec.base == "cope":
            self.processor = CoPE(self.head_dim, cfg.cope_npos)
        else:
            self.processor = None
        if spec.normaliser == "stickbreaking":
            self.normaliser = StickBreaking(n_head, self.head_dim, cfg.sb_attend_current, cfg.sb_remainder)
        else:
            self.normaliser = Softmax()
        self.parts = Parts(self.rope, self.bias, self.processor, self.normaliser, cfg.causal, self.head_dim)
        # Fail at construction, not at the first forward, when a forced backend cannot run this
        # composition (triton is judged for CUDA, the only device it runs on).
        plan_backend(self.parts, torch.device("cuda" if cfg.backend == "triton" else "cpu"), cfg.backend)

    def backend_for(self, device: torch.device) -> str:
        return plan_backend(self.parts, device, self.cfg.backend)

    def project(self, x: torch.Tensor):
        """x [B, T, C] -> q, k, v [B, H, T, d], q and k already rotated when the base is RoPE."""
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.rope is not None:
            q, k = self.rope(q, k, torch.arange(T, device=x.device))
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.project(x)
        out, rem = run_backend(self.backend_for(x.device), q, k, v, self.parts, self.cfg.chunk_size)
        out = self.normaliser.finish(out, rem, v)
        return self.proj(out.transpose(1, 2).reshape(B, T, C))
