"""RoPE (Su et al. 2021): rotate query and key pairs by a position-dependent angle, with the context
extensions practitioners apply to a RoPE model beyond its training length.

With theta_i = base^(-2i/d) (i = 0 .. d/2 - 1), a scale s and the training length L_train:
  none         angles m theta_i
  pi           Position Interpolation (Chen et al. 2023): angles (m / s) theta_i
  ntk          NTK-aware: base' = base s^(d / (d - 2))
  dynamic-ntk  NTK-aware with s = max(1, L / L_train) from the current length L
  yarn         YaRN (Peng et al. 2023), as its authors' code computes it: for b rotations over L_train,
               c(b) = d ln(L_train / (2 pi b)) / (2 ln base); low = floor(c(beta_fast)),
               high = ceil(c(beta_slow)), clamped to [0, d - 1]; ramp(i) = clamp((i - low) / (high - low),
               0, 1); theta'_i = theta_i / s ramp(i) + theta_i (1 - ramp(i)); and cos, sin (so q and k)
               times 0.1 ln s + 1 (1 when s <= 1), the attention temperature.
factor <= 0 means "auto": s = max(1, L / L_train) for the length L being processed, so within the
training length every method is the identity.

Partial RoPE (p-RoPE, Barbero et al. 2024, arXiv 2410.06205): a fraction p rotates the first p d dims
of each head (rotate-half within them) with the p d / 2 highest of the d / 2 frequencies above
(theta_i, i < p d / 2, scaled as above); the other dims pass unrotated (theta = 0).
"""

import importlib.util
import math
import weakref

import torch
from torch import nn

SCALINGS = ("none", "pi", "ntk", "dynamic-ntk", "yarn")
FUSED_DEVICE = "cuda"  # where q and k rotate in ops/rope/triton.py's kernel (elsewhere: PyTorch ops)


def triton_available() -> bool:
    """Whether triton can be imported (the fused rotation needs it; without it CUDA runs the PyTorch
    rotation)."""
    return importlib.util.find_spec("triton") is not None


class TableCache:
    """The last cos/sin table that the RoPE parts of one model with the same settings built: every
    layer of a forward reads the one its first layer built (at the default positions 0..T-1 every
    later forward of that length too), instead of each building its own (some eight small kernels
    a layer). `key` says what the table depends on besides the positions; the positions tensor of
    a call with explicit positions is held weakly and matched by identity and version. Nothing is
    kept while torch.compile traces (inductor fuses the table itself). builds: tables built."""

    def __init__(self):
        self.key, self.pos, self.value, self.builds = None, None, None, 0

    def __getstate__(self):  # a pickled model (or a deep copy) starts with no table
        return {"key": None, "pos": None, "value": None, "builds": 0}

    def get(self, key: tuple, pos: torch.Tensor | None, make):
        if torch.compiler.is_compiling():
            return make()
        # a table made in inference mode cannot be saved for a later backward: one key per mode
        key = (*key, torch.is_inference_mode_enabled(), None if pos is None else pos._version)
        held = None if self.pos is None else self.pos()
        if key != self.key or (pos is not None and held is not pos) or (pos is None and self.pos is not None):
            self.value, self.builds = make(), self.builds + 1
            self.key, self.pos = key, None if pos is None else weakref.ref(pos)
        return self.value


class RoPE(nn.Module):
    """Rotate-half layout, the first `fraction` of the head dimension rotated (all by default), base
    10000 by default."""

    def __init__(self, head_dim: int, base: float = 10000.0, scaling: str = "none", factor: float = 0.0,
                 train_len: int = 0, beta_fast: float = 32.0, beta_slow: float = 1.0, fraction: float = 1.0,
                 tables: TableCache | None = None):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        rotary = round(fraction * head_dim)
        if not 0 < fraction <= 1 or abs(rotary - fraction * head_dim) > 1e-6 or rotary % 2:
            raise ValueError(f"RoPE's fraction {fraction} of head dimension {head_dim} must be in (0, 1] and rotate an "
                             "even number of dims")
        if scaling not in SCALINGS:
            raise ValueError(f"unknown RoPE scaling {scaling!r}; choose one of {', '.join(SCALINGS)}")
        if scaling != "none" and train_len < 1:
            raise ValueError(f"RoPE scaling {scaling!r} needs the training length it extends (model.rope_train_len)")
        self.head_dim, self.base = head_dim, base
        self.key_dim = head_dim  # the width of q and k after the rotation (PoPE's doubles)
        self.scaling, self.factor, self.train_len = scaling, factor, train_len
        self.beta_fast, self.beta_slow = beta_fast, beta_slow
        self.rotary = rotary  # the rotated dims: the first `rotary` of each head
        inv_freq = base ** (-torch.arange(0, rotary, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.tables = TableCache() if tables is None else tables  # shared by layers of the same settings

    @classmethod
    def from_config(cls, ctx):
        c = ctx.cfg
        args = (ctx.head_dim, c.rope_base, c.rope_scaling, c.rope_scaling_factor, c.rope_train_len,
                c.rope_yarn_beta_fast, c.rope_yarn_beta_slow, c.rope_fraction)
        return cls(*args, tables=ctx.shared.setdefault(("rope tables", args), TableCache()))

    @property
    def settings(self) -> tuple:
        """Everything its angles depend on beside the positions (the layers of a decode step share
        one table when these are the same)."""
        return (self.head_dim, self.base, self.scaling, self.factor, self.train_len, self.beta_fast, self.beta_slow,
                self.rotary)

    @property
    def follows_length(self) -> bool:
        """Whether the scale follows the length processed (auto factor, or dynamic-ntk)."""
        return self.scaling != "none" and (self.scaling == "dynamic-ntk" or self.factor <= 0)

    def frequencies(self, length):
        """(theta' [..., d/2] fp32, the factor on cos and sin) for a context of `length` positions:
        an int, or a tensor of lengths (e.g. [B], one per sequence of a batch: theta' [B, d/2] and
        the factor [B]). A scale that follows the length is computed in float64 on the device from a
        tensor (an int is made one), so that an int and a tensor give the same bits and no host
        sync is needed; a fixed scale is a Python number."""
        if self.scaling == "none":
            return self.inv_freq, 1.0
        if not self.follows_length:
            return self._scaled(float(self.factor))
        L = torch.as_tensor(length, dtype=torch.float64, device=self.inv_freq.device)
        s = (L / self.train_len).clamp(min=1.0)
        inv, mscale = self._scaled(s)
        return torch.where(s[..., None] == 1, self.inv_freq, inv), mscale

    def _scaled(self, s):
        """theta' and the cos/sin factor at scale s: a Python float, or a float64 tensor (computed in
        float64, then theta' rounded to fp32)."""
        d, tensor = self.head_dim, isinstance(s, torch.Tensor)
        if not tensor and s == 1.0:
            return self.inv_freq, 1.0
        inv_freq = self.inv_freq.double() if tensor else self.inv_freq
        s_ = s[..., None] if tensor else s
        if self.scaling == "pi":
            inv = inv_freq / s_
        elif self.scaling in ("ntk", "dynamic-ntk"):
            exponent = -torch.arange(0, self.rotary, 2, dtype=torch.float64 if tensor else torch.float32,
                                     device=self.inv_freq.device) / d
            inv = (self.base * s_ ** (d / (d - 2))) ** exponent
        else:
            ramp = self.yarn_ramp().to(inv_freq.dtype)
            inv = inv_freq * (1 - ramp) + inv_freq / s_ * ramp
        if self.scaling != "yarn":
            mscale = torch.ones_like(s) if tensor else 1.0
        elif tensor:
            mscale = torch.where(s > 1, 0.1 * torch.log(s) + 1, torch.ones_like(s))
        else:
            mscale = 0.1 * math.log(s) + 1
        return inv.float(), mscale

    def yarn_ramp(self) -> torch.Tensor:
        """0 for the fast (high-frequency) dimensions YaRN keeps, 1 for the slow ones it interpolates."""
        d = self.head_dim

        def index_of(rotations: float) -> float:
            return d * math.log(self.train_len / (2 * math.pi * rotations)) / (2 * math.log(self.base))

        low = max(math.floor(index_of(self.beta_fast)), 0)
        high = min(math.ceil(index_of(self.beta_slow)), d - 1)
        if low == high:
            high += 0.001  # the authors' guard against a zero-width ramp
        i = torch.arange(self.rotary // 2, dtype=torch.float32, device=self.inv_freq.device)
        return ((i - low) / (high - low)).clamp(0, 1)

    def half_table(self, pos: torch.Tensor, length=None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, h] fp32 (h = r / 2: one angle per frequency) at positions pos [T], or
        [B, 1, T, h] per sequence (pos [B, T] or a length per sequence), the cos/sin factor included;
        `length`: see forward."""
        inv_freq, mscale = self.frequencies(pos.shape[-1] if length is None else length)
        angles = pos.to(torch.float32)[..., None] * inv_freq[..., None, :]  # [T, h] or [B, T, h]
        cos, sin = angles.cos(), angles.sin()
        if isinstance(mscale, torch.Tensor):
            mscale = mscale.float()[..., None, None]
        if not (isinstance(mscale, float) and mscale == 1.0):
            cos, sin = cos * mscale, sin * mscale
        if cos.dim() == 3:  # one row of angles per sequence: broadcast over the heads
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return cos, sin

    def table(self, pos: torch.Tensor, length=None, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, r] (r: the rotated dims) at positions pos [T], or [B, 1, T, r] per sequence (pos [B, T] or a
        length per sequence), in `dtype`, the cos/sin factor included; `length`: see forward."""
        cos, sin = self.half_table(pos, length)
        return torch.cat([cos, cos], -1).to(dtype), torch.cat([sin, sin], -1).to(dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, H, T, d] rotated by a table of `table` (its first r dims; the rest pass as they are)."""
        r = cos.shape[-1]
        if r < x.shape[-1]:
            return torch.cat([RoPE.rotate(x[..., :r], cos, sin), x[..., r:]], -1)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def step_table(self, pos: torch.Tensor, length=None, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """table()'s cos, and its sin with the first half's sign turned, for rotate_signed (decoding
        builds it once per step for all the layers)."""
        cos, sin = self.table(pos, length, dtype)
        half = self.rotary // 2
        return cos, torch.cat([-sin[..., :half], sin[..., half:]], -1)

    @staticmethod
    def rotate_signed(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """rotate(x, cos, sin) from step_table's tables, with the same bits (-a * b is -(a * b)) and
        one operation fewer (the sign is in the table, not negated in every layer)."""
        r = cos.shape[-1]
        if r < x.shape[-1]:
            return torch.cat([RoPE.rotate_signed(x[..., :r], cos, signed_sin), x[..., r:]], -1)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([x2, x1], -1) * signed_sin

    def step(self, qk: torch.Tensor, step):
        """A decode step's rows (qk: q and k stacked, [2, B, H, R, d]) rotated at step.q_pos, with the
        length of each sequence at this step; one table for the step's layers, q and k rotated
        together (one set of ops)."""
        cos, sin = step.shared(("rope", self.settings, qk.dtype),
                               lambda: self.step_table(step.q_pos, step.end - step.start, qk.dtype))
        return self.rotate_signed(qk, cos, sin)

    @staticmethod
    def fuses(x: torch.Tensor) -> bool:
        """Whether forward and project rotate in the fused kernel (which can also scale q's rows:
        q_scale); inductor fuses its own, and without triton the PyTorch ops rotate."""
        return x.device.type == FUSED_DEVICE and not torch.compiler.is_compiling() and triton_available()

    def forward(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor | None = None, length=None,
                heads_last: bool = False, q_scale: torch.Tensor | None = None):
        """Rotate q and k [..., T, d] at positions pos [T] (or [B, T], per sequence; None: 0..T-1);
        `length` is the context length that sets an auto or dynamic scale (default T; a tensor [B]:
        one per sequence). heads_last: the fused kernel writes q and k as [B, T, H, d] in memory
        (returned as [B, H, T, d] views), the layout in which SDPA's output is [B, T, H, d] too, so
        that the output projection reads it with no copy. q_scale (only where fuses(q)): a factor per
        row of q, no gradient (ops.rope.triton.rotate_qk)."""
        fused = self.fuses(q)
        if q_scale is not None and not fused:
            raise ValueError("RoPE scales q's rows only in its fused kernel (CUDA with triton, not compiling)")
        cos, sin = self._cached_tables(fused, q.dtype, q.shape[-2], q.device, pos, length)
        if fused:  # one launch
            from ..ops.rope.triton import rotate_qk

            return rotate_qk(q, k, cos, sin, q_scale=q_scale, heads_last=heads_last)
        return self.rotate(q, cos, sin), self.rotate(k, cos, sin)

    def project(self, qkv: torch.Tensor, pos: torch.Tensor | None = None, length=None, heads_last: bool = False,
                q_scale: torch.Tensor | None = None):
        """The attention's projection output qkv [B, T, 3, H, d] -> q, k, v [B, H, T, d], q and k rotated
        (q's rows scaled) as forward's. Fused, the kernel reads q and k from qkv and its backward writes
        their gradients and v's into one buffer in qkv's layout (ops.rope.triton.rotate_qkv)."""
        if not self.fuses(qkv):
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            return (*self(q, k, pos, length, heads_last, q_scale), v)
        from ..ops.rope.triton import rotate_qkv

        cos, sin = self._cached_tables(True, qkv.dtype, qkv.shape[1], qkv.device, pos, length)
        return rotate_qkv(qkv, cos, sin, q_scale=q_scale, heads_last=heads_last)

    def _cached_tables(self, fused: bool, dtype, T: int, device, pos, length):
        """_tables' tables, from the shared cache (one scale per sequence, length a tensor: none kept)."""
        if isinstance(length, torch.Tensor):
            return self._tables(fused, dtype, T, device, pos, length)
        key = ("fused" if fused else dtype, T, device, self.inv_freq.dtype, length)  # what the table depends on
        return self.tables.get(key, pos, lambda: self._tables(fused, dtype, T, device, pos, length))

    def _tables(self, fused: bool, dtype, T: int, device, pos, length):
        """The fused kernel's fp32 [.., T, h] tables, or rotate's [.., T, r] in q's dtype."""
        pos = torch.arange(T, device=device) if pos is None else pos
        return self.half_table(pos, length) if fused else self.table(pos, length, dtype)

    def extra_repr(self) -> str:
        rotary = f", rotary={self.rotary}/{self.head_dim}" if self.rotary < self.head_dim else ""
        if self.scaling == "none":
            return f"base={self.base}{rotary}"
        factor = "auto" if self.factor <= 0 else self.factor
        return f"base={self.base}, scaling={self.scaling}, factor={factor}, train_len={self.train_len}{rotary}"
