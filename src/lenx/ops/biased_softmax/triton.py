"""Fused causal softmax attention with a per-distance bias table: the DAPE V2 kernel with its
processor switched off (Kerple, ALiBi, T5, or no bias at all).

    out = softmax_causal(Q K^T / sqrt(d) + table[h, i - j + T - 1]) V

Flash-attention layout: one program per (batch x head, query block), heavy blocks first; online
softmax in base 2 (log2(e) folded into the scale and the bias); key tiles below the diagonal block
unmasked, the diagonal block's masked; never a T x T tensor. The bias reaches the kernels as a band
(band.py): each tile's bias is one contiguous block load, not a per-element gather. Backward: a
key-owner kernel for dK/dV and a query-owner kernel for dQ and the table gradient (no locks; the
table gradient is summed per diagonal inside a tile first, by rotating each row of dS, so a tile
issues ~BM + BN atomic adds instead of BM * BN). For the Kerple log bias the dq kernel can give
its two per-head parameters their gradients directly instead (biased_attention's `kerple`),
which is cheaper than the per-diagonal sums; so for Kerple power. notes/kernels.md has the measurements.

ROWS (FoX, lenx.ops.forgetting): the bias is c_i - c_j of per-token values c [B, H, T] instead, each
tile's from two vector loads (band.py: rows_ref, bias_tile); the key-owner kernel also gives c its gradient.

Masks (HAS_W, HAS_SEG; off, the kernels compile as without them): a window of WIN keys and document
ids (DOCS, LASTS: each token's document's first and last position, _launch.check_masks). The query-owner
kernels start at the first key tile a row of their block sees (tiles.key_tiles) and the key-owner
kernel stops after the last query tile that sees its keys (tiles.query_end): cost O(W), or O(the
documents' lengths), not O(T). Masked inside tiles: a window's edge tiles, and with documents every
tile (tiles.window_document).

A factor per query row (HAS_QF; off, the kernels compile as without it): a query temperature's
q_i <- f_i q_i taken into the score scale of row i (forward and both backward kernels); dQ is the
gradient in the unscaled q (f dS K), the key-owner kernel's dK takes dS f q, and where the factor
needs a gradient (NEED_DF) the dq kernel gives it, per row the dot of dS K with q.
"""

import math

import torch
import triton
import triton.language as tl

from .._launch import LOG2E, check_masks, check_qkv, check_table, dot_precision, new, new_like, strides
from ..tiles import key_tile, key_tiles, window_document
from .backward import _bias_bwd_dkdv, _bias_bwd_dq
from .band import BAND_PAD, BAND_W, bias_tile, rows_ref, tile_config
from .bands import Bands


@triton.jit
def _fwd_tile(q, kp, vp, band_t, off_t, cq, c_h, ref, m_i, l_i, acc, rows_c, cols, T, qk_scale, WIN, doc_r, DOC,
              HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, MASK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              W: tl.constexpr, RES16: tl.constexpr, PREC: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr):
    """One key tile of the online softmax, base 2 (qk_scale and the bias carry log2(e))."""
    k = key_tile(kp, cols, T, MASK)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    if MASK:
        # rows_c = min(row, T - 1): padding rows see every real key; keys past T are masked
        allowed = cols[None, :] <= rows_c[:, None]
        allowed = window_document(allowed, rows_c[:, None], cols[None, :], doc_r[:, None], DOC, T, WIN, HAS_W, HAS_SEG)
        if HAS_BIAS:
            s += bias_tile(band_t, off_t, cq, c_h, ref, cols, T, MASK, BM, BN, W, RES16, ROWS)
        s = tl.where(allowed, s, float("-inf"))
    elif HAS_BIAS:
        s += bias_tile(band_t, off_t, cq, c_h, ref, cols, T, MASK, BM, BN, W, RES16, ROWS)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = m_new
    if MASK and (HAS_W or HAS_SEG):  # a row may see no key yet: exponents against 0, not -inf - -inf
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = key_tile(vp, cols, T, MASK)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _bias_fwd(Q, K, V, BAND, OFF, C, QF, O, LSE,
              sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, sfb, sfh,
              T, qk_scale, DOCS, WIN,
              H: tl.constexpr, HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, DH: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, W: tl.constexpr, PAD: tl.constexpr, RES16: tl.constexpr,
              PREC: tl.constexpr, HAS_W: tl.constexpr, HAS_SEG: tl.constexpr, HAS_QF: tl.constexpr):
    """One program: BM query rows of one (batch, head). Key tiles strictly below the diagonal
    block need no mask (but at a window's edge, or with documents); the BM // BN tiles of the
    diagonal block do. Heavy blocks launch first. HAS_QF: each row's scores times its factor
    QF[b, h, t] (strides sfb, sfh, 1) too, folded into the scale (a [BM, 1] column instead of one number)."""
    bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    b = bh // H
    h = bh % H
    m0 = pid_m * BM
    rows = m0 + tl.arange(0, BM)
    rmask = rows < T
    rows_c = tl.minimum(rows, T - 1)
    dd = tl.arange(0, DH)
    nn = tl.arange(0, BN)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dd[None, :], mask=rmask[:, None], other=0.0)
    kp = K + b * skb + h * skh + nn[:, None] * skt + dd[None, :]
    vp = V + b * svb + h * svh + nn[:, None] * svt + dd[None, :]
    band_h = BAND + h * (T + 2 * PAD) * W + (m0 + PAD) * W  # band row of (m0, key block 0)
    off_h = OFF + h * (T + 2 * PAD) + m0 + PAD
    c_h = C + bh * T
    ref, cq = rows_ref(c_h, m0, rows, T, ROWS)
    if HAS_QF:  # padding rows: row T - 1's factor, as rows_c
        qk_scale = qk_scale * tl.load(QF + b * sfb + h * sfh + rows_c)[:, None]
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, DH], tl.float32)
    DOC = DOCS + b * T
    lo, edge = key_tiles(m0, rows, T, WIN, DOC, BM, BN, HAS_W, HAS_SEG)
    doc_r = tl.load(DOC + rows_c) if HAS_SEG else rows_c  # padding rows: row T - 1's, as rows_c
    if HAS_W or HAS_SEG:  # the masked tiles below the diagonal block, farthest first
        for n0 in range(lo, edge, BN):
            m_i, l_i, acc = _fwd_tile(q, kp + n0 * skt, vp + n0 * svt, band_h - n0 * W, off_h - n0, cq, c_h, ref,
                                      m_i, l_i, acc, rows_c, n0 + nn, T, qk_scale, WIN, doc_r, DOC, HAS_BIAS, ROWS,
                                      True, BM, BN, W, RES16, PREC, HAS_W, HAS_SEG)
    for n0 in range(edge, m0, BN):
        m_i, l_i, acc = _fwd_tile(q, kp + n0 * skt, vp + n0 * svt, band_h - n0 * W, off_h - n0, cq, c_h, ref,
                                  m_i, l_i, acc, rows_c, n0 + nn, T, qk_scale, WIN, doc_r, DOC, HAS_BIAS, ROWS, False,
                                  BM, BN, W, RES16, PREC, HAS_W, HAS_SEG)
    # Without masks key m0 (the diagonal block's first) is allowed for every row, padding rows too,
    # so m_i is finite after the first diagonal tile and exp2(m_i - m_new) never sees inf - inf; with
    # masks _fwd_tile guards it (every row sees itself: m_i is finite at the end).
    for n0 in range(m0, tl.minimum(m0 + BM, T), BN):
        m_i, l_i, acc = _fwd_tile(q, kp + n0 * skt, vp + n0 * svt, band_h - n0 * W, off_h - n0, cq, c_h, ref,
                                  m_i, l_i, acc, rows_c, n0 + nn, T, qk_scale, WIN, doc_r, DOC, HAS_BIAS, ROWS, True,
                                  BM, BN, W, RES16, PREC, HAS_W, HAS_SEG)
    out = acc / l_i[:, None]
    tl.store(O + b * sob + h * soh + rows[:, None] * sot + dd[None, :], out.to(O.dtype.element_ty), mask=rmask[:, None])
    tl.store(LSE + bh * T + rows, m_i + tl.log2(l_i), mask=rmask)  # base 2


class BiasedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, c, kerple_kind, kerple_x, kerple_y, tail, cfg, window=0, spans=None, bands=None,
                qf=None):
        """table: a per-distance bias table, or c: FoX's prefix sums [B, H, T] (the bias c_i - c_j),
        or neither; bands: the table's Bands instead (bands.py; the table then gets no gradient).
        window, spans: as _launch.check_masks returns them; qf: row_factor's table, or None."""
        # Inputs and their gradients share one contiguous layout (a strided view, e.g. q sliced out
        # of a fused qkv projection, is copied once: O(T) and cheap next to the attention itself).
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        B, H, T, DH = q.shape
        rows = c is not None
        c = c.detach().float().contiguous() if rows else q  # a dummy pointer when unused
        has_band = table is not None or bands is not None
        res16 = has_band and cfg["band"][0] == "fp16"
        # the kernels work in base 2: exp2(s * log2(e)) = exp(s), so the bias is scaled once here
        if table is not None and bands is None:
            bands = Bands(table, T, res16)
        band, off = (bands.band, bands.off) if has_band else (q, q)  # dummy pointers when unused
        out = new((B, H, T, DH), q)
        lse = new((B, H, T), q, torch.float32)  # base 2
        BM, BN, nw, ns = cfg["fwd"]
        grid = (B * H, triton.cdiv(T, BM))
        first = spans[0] if spans is not None else q  # a pointer the kernels never read without documents
        fp, sfb, sfh = _factor_args(qf, q)
        _bias_fwd[grid](q, k, v, band, off, c, fp, out, lse, *strides(q), *strides(k), *strides(v), *strides(out),
                        sfb, sfh, T, DH ** -0.5 * LOG2E, first, window, H=H, HAS_BIAS=has_band or rows, ROWS=rows,
                        DH=DH, BM=BM, BN=BN, W=BAND_W, PAD=BAND_PAD, RES16=res16, PREC=dot_precision(q.dtype),
                        HAS_W=window > 0, HAS_SEG=spans is not None, HAS_QF=qf is not None, num_warps=nw, num_stages=ns)
        ctx.save_for_backward(q, k, v, band, off, c, out, lse, kerple_x, kerple_y, spans, qf)
        ctx.bands = bands  # the transposed band, for the backward (its tensors: no input or output)
        ctx.window, ctx.has_seg = window, spans is not None
        ctx.kerple_kind = kerple_kind
        ctx.tail = tail
        ctx.has_band, ctx.rows = has_band, rows
        ctx.res16 = res16
        ctx.cfg = cfg
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, band, off, c, out, lse, px, py, spans, qf = ctx.saved_tensors
        masks = dict(HAS_W=ctx.window > 0, HAS_SEG=ctx.has_seg, HAS_QF=qf is not None)
        fp, sfb, sfh = _factor_args(qf, q)
        B, H, T, DH = q.shape
        cfg = ctx.cfg
        dout = dout.contiguous()
        delta = (out.float() * dout).sum(-1)  # rowsum(dO * O) [B, H, T], each product in fp32
        # Gradients are contiguous like the saved inputs, so the kernels reuse q/k/v strides for them.
        dq, dk, dv = new_like(q), new_like(k), new_like(v)
        prec = dot_precision(q.dtype)
        scale = DH ** -0.5
        # Kerple: the kernel sums the two parameters' gradients itself (two sums per program instead of
        # per-diagonal sums of the table gradient, which the table then would carry to them)
        kind = {"log": 1, "power": 2}[ctx.kerple_kind] if px is not None else 0
        kerple = kind if kind and (ctx.needs_input_grad[6] or ctx.needs_input_grad[7]) else 0
        need_dtab = ctx.has_band and ctx.needs_input_grad[3] and px is None
        dtab = torch.zeros(H, 2 * T - 1, dtype=torch.float32, device=q.device) if need_dtab else q
        kg = torch.zeros(B * H, 2, dtype=torch.float32, device=q.device) if kerple else q
        r2_f = py.float().contiguous() if kerple == 1 else q
        BM, BN, nw, ns = cfg["dkdv"]
        band_t = cfg["dkdv_band"][0] == "T" and ctx.has_band
        kband = ctx.bands.transposed() if band_t else band  # the key-owner kernel's band
        first, last = (spans[0], spans[1]) if ctx.has_seg else (q, q)  # unread without documents
        dc = new((B, H, T), q, torch.float32) if ctx.rows else q
        has_bias = ctx.has_band or ctx.rows
        _bias_bwd_dkdv[(B * H, triton.cdiv(T, BN))](
            q, k, v, kband, off, c, fp, dout, lse, delta, dk, dv, dc, *strides(q), *strides(k), *strides(v),
            *strides(dout), sfb, sfh, T, scale * LOG2E, scale, first, last, ctx.window, H=H, HAS_BIAS=has_bias,
            ROWS=ctx.rows, DH=DH, BM=BM, BN=BN, W=BAND_W, PAD=BAND_PAD, RES16=ctx.res16, BAND_T=band_t, PREC=prec,
            **masks, num_warps=nw, num_stages=ns)
        BM, BN, nw, ns = cfg["dq"]
        need_df = qf is not None and ctx.needs_input_grad[13]
        df = new((B, H, T), q, torch.float32) if need_df else q
        _bias_bwd_dq[(B * H, triton.cdiv(T, BM))](
            q, k, v, band, off, c, fp, dout, lse, delta, dq, df, dtab, r2_f, kg, *strides(q), *strides(k), *strides(v),
            *strides(dout), sfb, sfh, T, scale * LOG2E, scale, ctx.tail or 0, first, ctx.window, H=H, HAS_BIAS=has_bias,
            ROWS=ctx.rows,
            NEED_DTAB=need_dtab, KERPLE=kerple,
            TAIL=need_dtab and ctx.tail is not None and ctx.tail < T, DH=DH,
            BM=BM, BN=BN, W=BAND_W, PAD=BAND_PAD, RES16=ctx.res16, PREC=prec, HW=q.is_cuda, **masks,
            NEED_DF=need_df, num_warps=nw, num_stages=ns)
        dx = dy = None
        if kerple:  # see _dq_tile: sums of dS bias log2(e), and of dS n / (1 + r2 n) or dS bias log2(e) log2 n
            sums = kg.view(B, H, 2).sum(0)
            xf = px.detach().float()  # no graph to px under create_graph (the kernel has no double backward)
            dx = (math.log(2.0) / xf * sums[:, 0]).to(px.dtype)
            dy = (-xf * sums[:, 1] if kerple == 1 else math.log(2.0) ** 2 * sums[:, 1]).to(py.dtype)
        broadcast = [i for i in (0, 1) if qf is not None and qf.shape[i] == 1]
        if need_df and broadcast:  # summed over the factor's broadcast dimensions (an empty list would sum all)
            df = df.sum(dim=broadcast, keepdim=True)
        return (dq, dk, dv, (dtab if need_dtab else None), (dc if ctx.rows else None), None, dx, dy, None, None, None,
                None, None, df if need_df else None)


def biased_attention(q, k, v, table=None, kerple=None, tail=None, config: dict | None = None, window: int = 0,
                     segments=None, bands=None, q_scale=None):
    """Causal softmax attention of q, k, v [B, H, T, d] with an optional per-distance bias table
    [H, 2T - 1] (entry (i - j) + T - 1; see reference.py). Differentiable in all four; the table
    gradient flows on to whatever built the table.

    kerple: None, or ("log", r1, r2) / ("power", a, p): the Kerple bias the table holds,
    -r1 ln(1 + r2 |i - j|) or -a |i - j|^p, with its clamped per-head parameters ([H] each). Then
    the backward gives those two their gradients directly (cheaper than the table gradient) and the
    table gets none.

    tail: None, or a distance from which the table is constant (T5's last bucket, say) and only
    the sum of its gradient over those distances matters (it comes from one parameter per head).
    The table gradient then carries that sum at entry `tail` and zero beyond it: cheaper, and
    exact for whatever sums the table's entries from `tail` on, not entry by entry.

    config: tile settings over the defaults (band.py: CONFIG and tile_config), for tuning and tests.

    window: each row sees its `window` most recent keys (0: all); segments: document ids [B, T] (any
    integers), no row sees another document's key (as reference.biased_softmax_reference).

    bands: instead of the table, its Bands (bands.py: built once, kept by bands.cached_bands while
    the table is unchanged) for this T and the band dtype of this call's tiles; the table then gets
    no gradient (with kerple its parameters still get theirs).

    q_scale: a factor per query row that broadcasts to [B, H, T] ([T], [H, T], [B, 1, T], ...):
    row t of head h is attended as q[b, h, t] * q_scale[b, h, t] (a query temperature), the factor
    folded into the kernels' score scale; q's gradient is then the gradient in the unscaled q, the
    factor included, and q_scale gets its own (from the dq kernel: per row, dS K / sqrt(d) . q) where
    it requires one (SSMax's s_h log n)."""
    check_qkv(q, k, v)
    H, T = q.shape[1], q.shape[2]
    if table is not None:
        check_table(table, H, T)
    cfg = tile_config(q.dtype, q.shape[-1], config)
    if bands is not None and (table is not None or (bands.H, bands.T, bands.res16) != (H, T, cfg["band"][0] == "fp16")):
        raise ValueError(f"bands must replace the table and fit H {H}, T {T} and this call's band dtype "
                         f"({cfg['band'][0]}), got a table {table is not None} and bands for H {bands.H}, T {bands.T}, "
                         f"{'fp16' if bands.res16 else 'fp32'}")
    kind = x = y = None
    if kerple is not None:
        kind, x, y = kerple
        if kind not in ("log", "power") or (table is None and bands is None) or tuple(x.shape) != (H,) \
                or tuple(y.shape) != (H,):
            raise ValueError(f"kerple must be ('log' or 'power', x, y) with the Kerple table and x, y of shape [{H}], "
                             f"got kind {kind!r}")
    if tail is not None and (table is None or kerple is not None or int(tail) < 1):
        raise ValueError(f"tail must be a distance >= 1 with a table and without kerple, got {tail!r}")
    window, spans = check_masks(window, segments, q.shape[0], T, q.device)
    qf = row_factor(q_scale, *q.shape[:3], q.device)
    return BiasedAttention.apply(q, k, v, table, None, kind, x, y, None if tail is None else int(tail), cfg, window,
                                 spans, bands, qf)


def row_factor(q_scale, B: int, H: int, T: int, device):
    """q_scale as the kernels read it: fp32 [1 or B, 1 or H, T], contiguous (checked as a one-line
    error; its gradient flows back to q_scale); None stays None."""
    if q_scale is None:
        return None
    f = q_scale
    f = f.reshape((1,) * (3 - f.dim()) + tuple(f.shape)) if 1 <= f.dim() <= 3 else f
    if f.dim() != 3 or f.shape[0] not in (1, B) or f.shape[1] not in (1, H) or f.shape[2] != T \
            or f.device != torch.device(device) or f.is_complex():
        raise ValueError(f"q_scale must be a real factor per row on q's device, broadcasting to [B, H, T] = "
                         f"{[B, H, T]} with T whole, got {tuple(q_scale.shape)} on {q_scale.device}")
    return f.float().contiguous()


def _factor_args(qf, q):
    """(pointer, batch stride, head stride) of row_factor's table for the kernels: a broadcast
    dimension's stride is 0; without a table q stands in for a pointer never read."""
    if qf is None:
        return q, 0, 0
    return qf, (0 if qf.shape[0] == 1 else qf.stride(0)), (0 if qf.shape[1] == 1 else qf.stride(1))
