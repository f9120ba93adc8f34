"""FlexAttention: softmax with a per-distance bias table and/or a window or document mask (its
block mask skips the blocks a window leaves out), no processor.

The block mask is built from the mask rules and the document ids (a tensor its mask_mod reads,
not a value baked into the kernel), and kept, per rules (length, window), while the calls bring
the same ids tensor: the layers of one step share their ids, so one build serves them all; new
ids (every training step) build a new mask but compile nothing new, the compiled kernel taking
the mask as an argument (tests/attention/test_flex_documents.py counts both). A build reads the
tiles' bounds and ids (_block_mask): O(B (T / 128)^2), not create_block_mask's O(B T^2)."""

import torch

from .base import Backend

# Inductor's default tiles ask for more shared memory than an H200 has once the bias table needs a
# gradient (245760 > 232448 bytes, measured); these smaller ones fit.
KERNEL_OPTIONS = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32}
KEPT_MASKS = 16  # block masks kept (one per length and window seen last)
BLOCK = 128  # the block mask's tile (FlexAttention's default sparse block size)


def _has_flex() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


class Flex(Backend):
    name = "flex"

    def __init__(self, compiler="inductor", compiled_on=("cuda",)):
        self._compiled = None
        self._compiler = compiler  # torch.compile's backend (a test counts compilations with its own)
        self._compiled_on = compiled_on  # device types that run the compiled kernel (elsewhere: flex unfused)
        self._masks = {}  # (length, causal, window, device) -> (ids tensor, its version, block mask)

    def unsupported(self, parts, device):
        biased = parts.bias is not None and parts.bias.per_distance
        if ((parts.bias is not None and not biased) or not (biased or parts.masked) or parts.processor is not None
                or parts.normaliser.name != "softmax"):
            return ("FlexAttention here takes softmax with a per-distance bias (alibi, kerple, kerple-power, t5) "
                    "or a window or document mask, and no processor")
        if not _has_flex():
            return "this torch has no FlexAttention"
        if device.type == "cuda" and parts.head_dim is not None and parts.head_dim < 16:
            # the compiled kernel refuses smaller heads (the CHE encoder has d 64 / 8 heads = 8)
            return f"compiled FlexAttention needs a head dim of at least 16 (got {parts.head_dim})"
        return None

    def auto(self, device):
        return device.type == "cuda"  # on CPU it runs unfused and has no backward

    def trains(self, device):
        return device.type == "cuda"

    def run(self, q, k, v, parts, chunk_size=256, segments=None):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if not self.trains(q.device) and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise RuntimeError("FlexAttention has no backward on CPU; train with backend='chunked' (or 'auto')")
        T = q.shape[-2]
        score_mod = None
        if parts.bias is not None:
            table = parts.bias.table(T, q.device)  # [H, 2T - 1]
            table = table.to(torch.float64 if q.dtype == torch.float64 else torch.float32)

            def score_mod(score, b, h, q_idx, kv_idx):
                return score + table[h, q_idx - kv_idx + T - 1]

        block_mask = self._mask(parts, T, q.device, segments)
        if q.device.type not in self._compiled_on:
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask), None
        if self._compiled is None:
            # One compiled kernel per sequence length: an evaluation sweeps ~8 lengths, more than
            # dynamo's default recompile limit, past which it would silently run flex unfused.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            self._compiled = torch.compile(flex_attention, dynamic=False, backend=self._compiler)
        return self._compiled(q, k, v, score_mod=score_mod, block_mask=block_mask,
                              kernel_options=KERNEL_OPTIONS if q.is_cuda else None), None

    def _mask(self, parts, T: int, device, segments):
        """_block_mask, or the one kept for these rules when the ids tensor is the one it was built
        from, unchanged since (a layout's layers of several windows keep one each)."""
        if torch.compiler.is_compiling():  # inside a compiled model (train.compile): dynamo traces the build
            return _block_mask(parts, T, device, segments)
        key = (T, parts.causal, parts.window, str(device))
        version = None if segments is None else segments._version
        kept = self._masks.get(key)
        if kept is not None and kept[0] is segments and kept[1] == version:
            return kept[2]
        block_mask = _block_mask(parts, T, device, segments)
        self._masks.pop(key, None)
        self._masks[key] = (segments, version, block_mask)
        if len(self._masks) > KEPT_MASKS:  # an evaluation's sweep of lengths: drop the oldest
            del self._masks[next(iter(self._masks))]
        return block_mask


def _block_mask(parts, T: int, device, segments, block: int = BLOCK):
    """The causal cut, the window and the documents as one block mask (None: nothing masked),
    classified per tile of block x block from the tiles' bounds and their ids' least and greatest,
    never from the T x T mask itself (what create_block_mask evaluates: O(T^2) memory): a tile is
    skipped when no rule can hold in it, full (no mask_mod) when every rule holds in all of it,
    else partial. Exact for the causal cut and the window; with documents a tile whose id ranges
    meet but whose common documents no row of it may see stays partial (masked inside, correct)."""
    from torch.nn.attention.flex_attention import BlockMask, and_masks

    rules = []
    if parts.causal:
        rules.append(lambda b, h, qi, ki: ki <= qi)
    if parts.window:
        window = parts.window
        rules.append(lambda b, h, qi, ki: qi - ki < window)
    if segments is not None:
        rules.append(lambda b, h, qi, ki: segments[b, qi] == segments[b, ki])
    if not rules:
        return None
    n = -(-T // block)
    first = torch.arange(n, device=device) * block
    last = (first + block).clamp(max=T) - 1
    q0, q1, k0, k1 = first[:, None], last[:, None], first[None, :], last[None, :]
    some = torch.ones(1, n, n, dtype=torch.bool, device=device)  # some (row, key) of the tile may be seen
    every = some.clone()  # all of them may
    if parts.causal:
        some, every = some & (k0 <= q1), every & (k1 <= q0)
    if parts.window:
        some, every = some & (k1 > q0 - window), every & (k0 > q1 - window)
    if segments is not None:
        # each tile's least and greatest id (the last tile padded with its last id)
        padded = torch.cat([segments, segments[:, -1:].expand(-1, n * block - T)], 1).view(-1, n, block)
        lo, hi = padded.amin(-1), padded.amax(-1)
        some = some & (lo[:, None, :] <= hi[:, :, None]) & (lo[:, :, None] <= hi[:, None, :])
        every = every & (lo == hi)[:, :, None] & (lo == hi)[:, None, :] & (lo[:, :, None] == lo[:, None, :])
    if T % block:  # a tile past the end is never full (its padding is masked), as create_block_mask has it
        every[:, -1, :] = False
        every[:, :, -1] = False
    full, partial = some & every, some & ~every
    return BlockMask.from_kv_blocks(*_ordered(partial), *_ordered(full), BLOCK_SIZE=block,
                                    mask_mod=and_masks(*rules), seq_lengths=(T, T))


def _ordered(tiles):
    """[B, n, n] booleans -> (their count per row [B, 1, n], their column indices first [B, 1, n, n]), int32."""
    tiles = tiles[:, None].to(torch.int32)
    return tiles.sum(-1, dtype=torch.int32), torch.argsort(tiles, dim=-1, descending=True, stable=True).to(torch.int32)
