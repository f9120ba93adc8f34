"""Multi-Token Attention (MTA; Golovneva et al. 2025, arXiv 2504.00927), written from the paper:

    Â = S (+ Bias)                        the base's logits, S = Q K^T / sqrt(d)
    C = Conv2d_θ(Mask_0(Â))               per head, a c_q x c_k kernel: entry (i, j) reads the rows of
                                          queries i - c_q + 1 .. i (past queries only) and the keys
                                          j - c_k // 2 .. j + c_k // 2; zero padding, no conv bias
    L = MixPre(C)                         head mixing within groups of c_h heads (or none)
    P = Softmax(Mask_-inf(L))
    P' = Mask_0(Conv2d_θ'(P))             the optional post-softmax key-query convolution (the released
                                          configs': c_q' x c_k' = 6 x 11), the same form on the probabilities
    A = MixPost(P')                       the same mixing on the probabilities (or none)
    out_h = A_h V_h,   then per head  o = RMSNorm(out_h) * w,  o * sigmoid(g . o + b)   (group norm + scalar gate)

Mask_0 zeroes every entry whose key is after its own row's query (and keys that do not exist), so no
output reads a future key: the paper's "mask with 0 before the convolution and -inf after". After the
softmax the convolution spreads weight onto future keys, so Mask_0 follows it (and precedes it too, for
rows that attend no key). Neither Conv2d_θ' nor MixPost is renormalised (the paper and its code use
the weights as they are). The order is the released code's: convolution, mixing, softmax,
convolution, mixing. Kernel layout (F.conv2d's):
kernel [H, 1, c_q, c_k], row a reads query i - (c_q - 1) + a, column b reads key j - c_k // 2 + b;
the identity kernel has a single 1 at [c_q - 1, c_k // 2]. Mixing weights [G, c_h, c_h]: head a of
group g becomes sum_b w[g, a, b] x[g c_h + b].

Masks (a window, document ids): an entry (r, s) a mask hides from row r is zeroed as one past the
causal edge, before either convolution (Mask_0 zeroes it, and the -inf mask or Mask_0 after the
post-softmax convolution masks the row's own masked entries). Another document's keys do not exist
for an output row: its entry (i, j) reads no input (r, s) whose key s is of another document than i
(key_valid per row), so it reads none of another document's rows either (their nonzero entries are
all at their own document's keys): the query direction sees zero padding above a document's first
row, and each document's rows are those of it run alone. At a window's left edge an output (i, j)
may read an earlier row's entries at keys left of i's window where that row sees them.
"""

import math

import torch
from torch.nn import functional as F


def future_mask(q_pos, k_pos):
    """True where the key is after the row's query: [Tq, Tk], or [B, 1, Tq, Tk] per sequence."""
    mask = k_pos[..., None, :] > q_pos[..., :, None]
    return mask.unsqueeze(-3) if mask.dim() == 3 else mask


MIX_SPLIT = 16  # the mixing weights' gradient: each map's N in 16 parts (_Mix)


def mix_heads(x, w, split: int = MIX_SPLIT):
    """x [B, H, ...] mixed within groups of c_h heads by w [G, c_h, c_h] (H = G c_h), in the dtype a
    matmul of x would take (autocast's). One batched matmul over x's own layout [B G, c_h, N] (no
    copy of x or of the output; not an einsum, which folds B into the columns through a permuted
    copy in and out), its operands aligned for the GPU's fast kernels (_Mix). split: how the
    weights' gradient splits each map's N for parallelism (_Mix.backward; 1: one matmul a map)."""
    G, c, _ = w.shape
    groups = x.to(_matmul_dtype(x)).reshape(x.shape[0] * G, c, -1)
    return _Mix.apply(groups, w, split).view(x.shape)


def _matmul_dtype(x):
    """The dtype autocast gives a matmul of x (float64 is never cast), else x's."""
    kind = x.device.type
    if x.dtype != torch.float64 and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype


def _aligned(w, batch: int, dtype):
    """w [G, c, c] as [batch G, c, c] in `dtype`: views of a buffer whose rows are a multiple of 8
    entries long, so every row starts 16 bytes after the last (TMA's rule for row strides). Written
    out per batch (a few KB), not broadcast with a zero batch stride. On an H200 this did not take
    cuBLAS off its sm80 wmma kernel for the product (K = 12 is what it rejects, measured at B 32,
    T 512: 15 ms of MTA's 170 ms step forward, 15 ms in dx)."""
    G, c, _ = w.shape
    buf = torch.zeros(batch, G, c, -(-c // 8) * 8, dtype=dtype, device=w.device)
    buf[..., :c] = w
    return buf.view(batch * G, c, -1)[..., :c]


class _Mix(torch.autograd.Function):
    """out[z] = w[z % G] @ x[z] for x [Z, c, N] (Z = B G), w [G, c, c] (any float dtype; used in x's).
    backward: dx[z] = w^T @ g[z] (the same aligned weights), and dw as one matmul a map of its N
    split in S parts: each map's [c, N] rows read as [c S, N / S] (a view), so g' x'^T [c S, c S]
    holds every part's c x c product on its diagonal blocks, summed in fp32 (the blocks off the
    diagonal are S times the products dw needs: cheap, as the matmul is memory-bound either way).
    Without the split it is [c, N] @ [N, c] a map: B G output tiles each looping over all N, on
    too few of the GPU's SMs (the 32x32 wmma kernel took ~1.6 ms a call at B 32, N 512^2); split,
    its output is [c S]^2 (192^2 at c 12) with aligned rows (on an H200 cuBLAS runs it as a magma
    sgemmEx kernel: 21 ms of the 170 ms step at B 32, T 512)."""

    @staticmethod
    def forward(ctx, x, w, split):
        wz = _aligned(w, x.shape[0] // w.shape[0], x.dtype)
        ctx.save_for_backward(x, wz)
        ctx.w_dtype, ctx.groups, ctx.split = w.dtype, w.shape[0], split
        return torch.bmm(wz, x)

    @staticmethod
    def backward(ctx, g):
        x, wz = ctx.saved_tensors
        dx = torch.bmm(wz.transpose(1, 2), g) if ctx.needs_input_grad[0] else None
        dw = _mix_weight_grad(g, x, ctx.groups, ctx.split).to(ctx.w_dtype) if ctx.needs_input_grad[1] else None
        return dx, dw, None


def _mix_weight_grad(g, x, G: int, split: int):
    """sum over z in each group's maps of g[z] x[z]^T, [G, c, c] in fp32 (fp64 for fp64): g and x
    [Z, c, N], N split in S parts (S = split, or a smaller power of two that divides N into parts
    of whole 16-byte rows)."""
    Z, c, N = x.shape
    S = split
    while S > 1 and N % (S * 8):
        S //= 2
    rows = torch.bmm(g.reshape(Z, c * S, N // S), x.reshape(Z, c * S, N // S).transpose(1, 2))
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    blocks = rows.view(Z // G, G, c, S, c, S).diagonal(dim1=3, dim2=5)  # [B, G, c, c, S]
    return blocks.sum((0, -1), dtype=acc)


def mta_scores(logits, kernel=None, pre_mix=None, q_pos=None, k_pos=None, key_valid=None, visible=None, conv=None,
               mask: bool = True):
    """L = MixPre(Conv2d_θ(Mask_0(Â))) for logits Â [B, H, Tq, Tk] of rows at q_pos against keys at
    k_pos ([Tq], [Tk] or per sequence [B, Tq], [B, Tk]; default: the rows are the last Tq of Tk
    positions). kernel [H, 1, c_q, c_k] or None (no convolution), pre_mix [G, c_h, c_h] or None.
    key_valid [B, Tk] (default all): missing keys read as zero; per row [B, Tq, Tk] (document ids):
    the keys of each row's document, the others missing to that row's convolution (see the module
    docstring). visible [Tq, Tk] or [B, Tq, Tk] (default all): entries a window or document mask
    hides, zeroed as past the causal edge. The rows' query convolution reads only the rows given: a
    block's first c_q - 1 rows see zero padding above them, so a caller that needs exact rows gives
    the c_q - 1 rows before them too and drops those (the query halo). conv: the function that
    convolves, with _conv's arguments (None: _conv; route.score_conv picks a kernel). mask=False
    without a kernel: Mask_0 is left out (the masked entries keep their logits), for a caller whose
    softmax masks every entry Mask_0 would zero (the mixing keeps each entry at its (i, j))."""
    if kernel is None and not mask:
        return logits if pre_mix is None else mix_heads(logits, pre_mix)
    Tq, Tk = logits.shape[-2:]
    if k_pos is None:
        k_pos = torch.arange(Tk, device=logits.device)
    if q_pos is None:
        q_pos = k_pos[..., Tk - Tq:]
    # wheres, not masked_fills (a clone and a fill of the map on a GPU): the same values
    x = torch.where(future_mask(q_pos, k_pos), 0.0, logits)
    if visible is not None:
        x = torch.where(visible.unsqueeze(-3), x, 0.0)
    documents = None
    if key_valid is not None:
        if key_valid.dim() == 3:
            documents = key_valid
        x = torch.where(key_valid[:, None] if key_valid.dim() == 3 else key_valid[:, None, None, :], x, 0.0)
    if kernel is not None:
        x = (conv or _conv)(x, kernel, documents)
    return x if pre_mix is None else mix_heads(x, pre_mix)


def _conv(x, kernel, documents=None):
    """Conv2d_θ per head, zero padding: c_q - 1 rows above, c_k // 2 keys on either side. documents
    [B, Tq, Tk] (or None): the keys of each output row's document; the output (i, j) reads only
    inputs at those keys (one pass per key offset of the kernel then)."""
    c_q, c_k = kernel.shape[-2:]
    padded = F.pad(x, (c_k // 2, c_k // 2, c_q - 1, 0))
    kernel = kernel.to(x.dtype)
    if documents is None:
        return F.conv2d(padded, kernel, groups=kernel.shape[0])
    Tk = x.shape[-1]
    mine = F.pad(documents, (c_k // 2, c_k // 2))[:, None]  # [B, 1, Tq, Tk + c_k - 1]
    out = torch.zeros_like(x)
    for t in range(c_k):  # the inputs at keys j - c_k // 2 + t, kept where that key is of row i's document
        rows = F.conv2d(padded[..., t:t + Tk], kernel[..., t:t + 1], groups=kernel.shape[0])
        out = out + rows.masked_fill(~mine[..., t:t + Tk], 0.0)
    return out


def mta_probs(probs, allowed=None, kernel=None, post_mix=None, context: int = 0, key_valid=None, conv=None):
    """A = MixPost(Mask_0(Conv2d_θ'(Mask_0(P)))) for the softmax's probabilities P [B, H, Tq, Tk], allowed
    (broadcastable to P) the keys each row attends (a window's and a document's mask included);
    kernel [H, 1, c_q', c_k'] or None, post_mix [G, c_h, c_h] or None. key_valid [B, Tq, Tk] (document
    ids; None: one document): the keys of each row's document, the only ones its convolution reads.
    The first `context` rows are only read by the convolution (a block's query halo): they are dropped.
    conv: as mta_scores'."""
    if kernel is not None:
        documents = key_valid if key_valid is not None and key_valid.dim() == 3 else None
        probs = torch.where(allowed, (conv or _conv)(torch.where(allowed, probs, 0.0), kernel, documents), 0.0)
    # mixed before the halo rows are dropped: the mixing then reads the map as it lies (no copy)
    probs = probs if post_mix is None else mix_heads(probs, post_mix)
    return probs[..., context:, :]


def group_norm(out, weight, gate_w=None, gate_b=None, eps: float = 1e-5):
    """Each head's output out [B, H, T, d] RMS-normalised over d (in fp32 or fp64), times weight [d];
    then, with a gate (gate_w [d], gate_b [1]), times sigmoid(gate_w . o + gate_b), one scalar per
    head and position."""
    acc = torch.float64 if out.dtype == torch.float64 else torch.float32
    x = out.to(acc)
    o = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.to(acc)
    if gate_w is not None:
        o = o * torch.sigmoid(o @ gate_w.to(acc) + gate_b.to(acc))[..., None]
    return o.to(out.dtype)


@torch.no_grad()
def mta_loops(q, k, v, kernel=None, pre_mix=None, post_mix=None, bias=None, norm=None, post_kernel=None,
              window: int = 0, segments=None):
    """Causal MTA attention of q, k, v [B, H, T, d] by explicit loops over every term of the formula
    (float64, small T only): the definition the tensor form is tested against. bias [H, T, T] (or
    [B, H, T, T]) or None; norm (weight, gate_w, gate_b) or None (no group norm); post_kernel the
    post-softmax convolution's [H, 1, c_q', c_k'] or None. window (0: none) and segments [B, T]
    (document ids, or None): the masks, applied entry by entry as the module docstring says."""
    B, H, T, d = q.shape
    q, k, v = q.double(), k.double(), v.double()

    def seen(b, r, s):  # row r sees key s: the causal edge, the window, one document
        if not (0 <= s <= r < T) or (window and r - s >= window):
            return False
        return segments is None or bool(segments[b, r] == segments[b, s])

    def mine(b, i, s):  # key s is of output row i's document
        return segments is None or bool(segments[b, i] == segments[b, s])
    logits = torch.zeros(B, H, T, T, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                for j in range(i + 1):
                    logits[b, h, i, j] = float(q[b, h, i] @ k[b, h, j]) / math.sqrt(d)
                    if bias is not None:
                        logits[b, h, i, j] += float(bias[h, i, j] if bias.dim() == 3 else bias[b, h, i, j])

    def convolved(x, kernel):  # Conv2d_θ(Mask_0(x)), the zero padding around x read as Mask_0 does
        def masked(b, h, r, s, i):
            return float(x[b, h, r, s]) if 0 <= r < T and seen(b, r, s) and mine(b, i, s) else 0.0

        c_q, c_k = kernel.shape[-2:]
        y = torch.zeros_like(x)
        for b in range(B):
            for h in range(H):
                for i in range(T):
                    for j in range(T):
                        y[b, h, i, j] = sum(float(kernel[h, 0, a, t])
                                            * masked(b, h, i - (c_q - 1) + a, j - c_k // 2 + t, i)
                                            for a in range(c_q) for t in range(c_k))
        return y

    conv = logits.clone() if kernel is None else convolved(logits, kernel)

    def mixed(x, w):
        if w is None:
            return x
        c = w.shape[-1]
        y = torch.zeros_like(x)
        for h in range(H):
            g, a = divmod(h, c)
            for bh in range(c):
                y[:, h] += float(w[g, a, bh]) * x[:, g * c + bh]
        return y

    scores = mixed(conv, pre_mix)
    probs = torch.zeros_like(scores)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                row = [math.exp(float(scores[b, h, i, j])) if seen(b, i, j) else 0.0 for j in range(i + 1)]
                for j in range(i + 1):
                    probs[b, h, i, j] = row[j] / sum(row)
    if post_kernel is not None:  # then Mask_0 again: only the entries row i sees are kept
        probs = convolved(probs, post_kernel)
        for b in range(B):
            for i in range(T):
                for j in range(T):
                    if not seen(b, i, j):
                        probs[b, :, i, j] = 0.0
    probs = mixed(probs, post_mix)
    out = torch.zeros(B, H, T, d, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                for j in range(i + 1):
                    if seen(b, i, j):
                        out[b, h, i] += probs[b, h, i, j] * v[b, h, j]
    if norm is not None:
        weight, gate_w, gate_b = (None if t is None else t.double() for t in norm)
        for b in range(B):
            for h in range(H):
                for i in range(T):
                    o = out[b, h, i] / math.sqrt(float(out[b, h, i].pow(2).mean()) + 1e-5) * weight
                    if gate_w is not None:
                        o = o / (1 + math.exp(-(float(o @ gate_w) + float(gate_b[0]))))
                    out[b, h, i] = o
    return out
