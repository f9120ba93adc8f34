"""K_C, DAPE V2's conv backward as one all-heads kernel (the review kernels-2026-11-28.md, 4.1-4.2),
emulated on the CPU with the kernel's exact schedule, so that its bookkeeping is tested against autograd
of reference.dape_v2_scores in float64 and its rounding points are written down in one readable place.
Nothing here is fast. (Outside the kernel-source hash, as emulate.py.)

The forward through rewrite A (reference.dape_v2_tables), per query row i, keys u, h = k // 2:
    X = tril(S)   (0 at keys after i and outside [0, T)),   S = Q K^T / sqrt(d)
    Y[c, u] = sum_{t, h'} W1[c, h', t] X[h', u + t - h] + t1[c, i - u] - k0[u, c, i] (keys u < h)
    Z = LeakyReLU(Y) (0 at keys outside [0, T)),   logits = S + t2 + F,   F[h, j] = sum_{t, c} W2[h, c, t] Z[c, j + t - h]
Given G = dL/dlogits (0 above the diagonal), K_C forms
    dZ[c, u] = sum_{t, h'} W2[h', c, t] G[h', u - t + h]             (conv2 transposed)
    dY = LeakyReLU'(Y) dZ (0 at keys outside [0, T)),   dX[h, j] = sum_{t, c} W1[c, h, t] dY[c, j - t + h]
    dS = G + tril(dX)
    dW1[c, h, t] = sum X[h, j] dY[c, j - t + h],   dW2[h, c, t] = sum G[h, j] Z[c, j + t - h]
    dt1[c, i - u] += dY[c, u],   dk0[u, c, i] = -dY[c, u] (u < h),   dt2[h, i - j] += G[h, j]
(sums over rows and keys); the op's own gradients (bias-channel weights, b1, b2, the table) follow
from dt1, dk0 and dt2 through dape_v2_tables (input_grads: the host step P2).

Schedule. One program per (batch entry, block of block_m query rows), all heads. Halo: dS at key j
needs dY at j - h .. j + h, which needs dZ and Y there, which need G and X at j - 2h .. j + 2h: so a
key tile that computes block_n keys, its tap sums circular within the tile, is right on its inner
block_n - 2 * 2h keys, the ones it owns (64 computed, 64 / 60 / 56 owned at k 1 / 3 / 5). Tiles sit
on one grid, ws = -2h + n (block_n - 4h) (key_tiles), and a program walks them from its diagonal
down: the distances a tile touches then only grow, so the kernel's per-distance window slides one
way and each distance is flushed once. Per tile, every head at once:
 1. X = S over the tile's keys (fp32 accumulator, scaled), tril, rounded (s_dtype); G read (g_dtype),
    0 above the diagonal and outside [0, T) whatever the buffer holds there.
 2. Y = conv1(X) + t1 - k0 (fp32); Z = LeakyReLU(Y) at keys in [0, T), else 0; the residual
    R = Z - LeakyReLU(t1[i - u]) (residual=True; t1 read as 0 at |i - u| >= T) rounded (z_dtype).
 3. dZ = conv2^T(G) (fp32), dY = LeakyReLU'(Y) dZ at keys in [0, T), rounded (dy_dtype);
    dX = conv1^T(dY) (fp32); dS = G + dX on the owned causal keys, rounded (ds_dtype), written.
 4. partial sums, each pair once: dW1 and dW2 and dt2 over the owned keys j of X and G; dt1 and dk0
    over the owned keys u of dY (dY is not 0 up to h keys past the diagonal, so tiles own keys up to
    the block's last row + h).
Products read both operands rounded to one dtype, as a wgmma does: the weights to their partner's,
X to dY's for dW1, G to Z's for dW2; None keeps full precision. The host (reduce_programs) sums the programs' partials in program order (deterministic)
and adds dW2's table part: with the residual, sum G Z = sum G R + sum_n dt2[h, n] LeakyReLU(t1[c, n - t + h]).
"""

import math

import torch
from torch.nn import functional as F

from .reference import dape_v2_tables

BM = 32    # query rows per program (the review's K_C)
BN = 64    # keys computed per tile


def halo(ks: int) -> int:
    """Keys of halo each side of a tile's owned keys: 2 (k // 2) (conv1 and conv2 each reach k // 2)."""
    return 2 * (ks // 2)


def key_tiles(q0: int, T: int, ks: int, block_m: int = BM, block_n: int = BN):
    """The key tiles of the program whose first row is q0, in walk order (diagonal first): (ws, lo, hi),
    the tile computing keys [ws, ws + block_n) and owning [lo, hi) = [ws + halo, ws + block_n - halo).
    The grid starts at ws = -halo (the first tile owns key 0) and steps by the owned width; the tiles
    own every key from 0 to the block's last row + k // 2, each once."""
    h, e = ks // 2, halo(ks)
    own = block_n - 2 * e
    if ks % 2 == 0 or own <= 0:
        raise ValueError(f"key tiles of {block_n} keys take odd kernel sizes with 4 (k // 2) < {block_n}, got {ks}")
    last = min(q0 + block_m, T) - 1
    return [(ws, ws + e, ws + block_n - e) for ws in reversed(range(-e, last - h + 1, own))]


def _rounder(dtype, acc):
    return (lambda x: x) if dtype is None else (lambda x: x.to(dtype).to(acc))


def conv_bwd_programs(q, k, G, w1, b1, w2, table=None, *, s_dtype=None, z_dtype=None, dy_dtype=None,
                      g_dtype=None, ds_dtype=None, residual: bool = True, block_m: int = BM, block_n: int = BN):
    """K_C's programs (module docstring) for q, k [B, H, T, d], G [B, H, T, T] (only its causal triangle
    is read), conv weights w1 [D, C, 1, k] (C = 2H with a bias table [H, 2T - 1], else H), b1 [D],
    w2 [H, D, 1, k]. Returns dS [B, H, T, T] (accumulator dtype: float64 for float64 q, else float32;
    0 above the diagonal) and the programs' partials: dict of [B, n_blocks, ...] tensors w1s [D, H, k],
    w2 [H, D, k], t1 [D, 2T - 1], k0 [h, D, T], t2 [H, 2T - 1] (the tables indexed like the bias
    table), and what reduce_programs needs besides."""
    B, H, T, d = q.shape
    ks = w1.shape[-1]
    h, e = ks // 2, halo(ks)
    key_tiles(0, T, ks, block_m, block_n)  # checks the kernel size against the tile
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    rs, rz, rdy, rg, rds = (_rounder(x, acc) for x in (s_dtype, z_dtype, dy_dtype, g_dtype, ds_dtype))
    w1, b1, w2 = (x.detach().to(acc) for x in (w1, b1, w2))
    D = w1.shape[0]
    if table is None:  # rewrite A without a bias: a zero table read by zero bias-channel weights
        tab, w1full = w1.new_zeros(H, 2 * T - 1), torch.cat([w1, torch.zeros_like(w1)], dim=1)
    else:
        tab, w1full = table.detach().to(acc), w1
    t1, k0, _ = dape_v2_tables(w1full, b1, w1.new_zeros(H), tab, T)
    W1, W2 = w1[:, :H, 0], w2[:, :, 0]                    # [D, H, k], [H, D, k]
    W1s, W1dy, W2g = rs(W1), rdy(W1), rg(W2)              # each product's operand dtype
    scale = 1.0 / math.sqrt(d)

    def tap_sum(Y, sign):  # Y [C, k, rows, keys]: sum_t Y_t[j + sign (t - h)], circular in the tile
        return sum(torch.roll(Y[:, t], sign * (h - t), dims=-1) for t in range(ks))

    def gather(tab_, dist):  # tab_[:, dist + T - 1], 0 at |dist| >= T (the kernel's masked load)
        return torch.where(dist.abs() < T, tab_[:, (dist + T - 1).clamp(0, 2 * T - 2)], 0.0)

    nblk = -(-T // block_m)
    part = {"w1s": torch.zeros(B, nblk, D, H, ks, dtype=acc), "w2": torch.zeros(B, nblk, H, D, ks, dtype=acc),
            "t1": torch.zeros(B, nblk, D, 2 * T - 1, dtype=acc), "k0": torch.zeros(B, nblk, h, D, T, dtype=acc),
            "t2": torch.zeros(B, nblk, H, 2 * T - 1, dtype=acc)}
    dS = torch.zeros(B, H, T, T, dtype=acc)
    cols = torch.arange(block_n)
    own = (cols >= e) & (cols < block_n - e)
    for b in range(B):
        for blk in range(nblk):
            q0 = blk * block_m
            rows = q0 + torch.arange(block_m)
            r_ok = rows < T
            rc = rows.clamp(max=T - 1)
            Q = q[b][:, rc].to(acc) * r_ok[:, None]
            p = {name: x[b, blk] for name, x in part.items()}
            for ws, _, _ in key_tiles(q0, T, ks, block_m, block_n):
                keys = ws + cols
                k_ok = (keys >= 0) & (keys < T)
                kc = keys.clamp(0, T - 1)
                K = k[b][:, kc].to(acc) * k_ok[:, None]
                tril = (keys[None, :] <= rows[:, None]) & k_ok[None, :] & r_ok[:, None]   # [BM, BN]
                hid = k_ok[None, :] & r_ok[:, None]             # where the hidden map exists
                # 1. scores and G
                X = rs(torch.where(tril, Q @ K.transpose(-1, -2) * scale, 0.0))      # [H, BM, BN]
                Gt = torch.where(tril, rg(G[b][:, rc][:, :, kc].to(acc)), 0.0)
                # 2. conv1 recomputed, the hidden map's residual
                dist = rows[:, None] - keys[None, :]
                t1v = gather(t1, dist)                                                # [D, BM, BN]
                Y = tap_sum(torch.einsum("cht,hij->ctij", W1s, X), 1) + t1v
                for j in range(h):
                    if ws <= j < ws + block_n:  # the tile holding key j < h
                        Y[:, :, j - ws] -= k0[j][:, rc] * r_ok
                Z = torch.where(hid, F.leaky_relu(Y, 0.01), 0.0)
                R = rz(Z - F.leaky_relu(t1v, 0.01) if residual else Z)
                # 3. conv2^T, the activation's derivative, conv1^T, dS on the owned causal keys
                dZ = tap_sum(torch.einsum("hct,hij->ctij", W2g, Gt), -1)
                dY = rdy(torch.where(hid, torch.where(Y > 0, dZ, 0.01 * dZ), 0.0))
                dX = tap_sum(torch.einsum("cht,cij->htij", W1dy, dY), -1)
                out = tril & own[None, :]
                ii, jj = out.nonzero(as_tuple=True)
                dS[b][:, rows[ii], keys[jj]] = rds((Gt + dX)[:, ii, jj])
                # 4. this program's partial sums, each (row, key) once
                Xw, Gw = rdy(X) * own, rz(Gt) * own   # one operand dtype per product: dY's, Z's
                for t in range(ks):
                    p["w1s"][:, :, t] += torch.einsum("cij,hij->ch", torch.roll(dY, t - h, dims=-1), Xw)
                    p["w2"][:, :, t] += torch.einsum("hij,cij->hc", Gw, torch.roll(R, h - t, dims=-1))
                yo = (hid & own[None, :]).nonzero(as_tuple=True)
                p["t1"].index_add_(1, dist[yo] + T - 1, dY[:, yo[0], yo[1]])
                p["t2"].index_add_(1, dist[yo] + T - 1, Gt[:, yo[0], yo[1]])
                for j in range(h):
                    if ws <= j < ws + block_n and own[j - ws]:
                        p["k0"][j].index_add_(1, rows[r_ok], -dY[:, r_ok, j - ws])
    part["lt1"] = F.leaky_relu(t1, 0.01) if residual else None
    return dS, part


def reduce_programs(part):
    """The host's reduction: the programs' partials summed in program order (batch-major), and dW2's
    table part added when the programs took the residual hidden map. Returns dict w1s [D, H, 1, k],
    w2 [H, D, 1, k], t1 [D, 2T - 1], k0 [h, D, T], t2 [H, 2T - 1]."""
    out = {}
    for name in ("w1s", "w2", "t1", "k0", "t2"):
        x = part[name].flatten(0, 1)
        total = torch.zeros_like(x[0])
        for prog in x:  # a fixed order, one program after another
            total += prog
        out[name] = total
    lt1 = part["lt1"]
    if lt1 is not None:
        H, D, ks = out["w2"].shape
        h, T = ks // 2, (lt1.shape[1] + 1) // 2
        gd = out["t2"][:, T - 1:]                             # G's sums by distance n >= 0
        lt = F.pad(lt1, (h, h))[:, T - 1:]                    # lt[:, m + h] = leaky(t1)[distance m], 0 at |m| >= T
        for t in range(ks):
            out["w2"][:, :, t] += gd @ lt[:, 2 * h - t: 2 * h - t + T].T   # distance n - t + h
    out["w1s"], out["w2"] = out["w1s"].unsqueeze(2), out["w2"].unsqueeze(2)
    return out


def conv_bwd_schedule(q, k, G, w1, b1, w2, table=None, **kw):
    """(dS, reduce_programs' gradients) of K_C's schedule; arguments as conv_bwd_programs."""
    dS, part = conv_bwd_programs(q, k, G, w1, b1, w2, table, **kw)
    return dS, reduce_programs(part)


def input_grads(grads, w1, b1, w2, b2, table=None):
    """The host step P2: the op's weight gradients (dw1 [D, C, 1, k], db1, dw2, db2, dtable or None) from
    reduce_programs' result, the chain rule through dape_v2_tables by autograd (what skewed.py's
    backward leaves to autograd too)."""
    H, T = w2.shape[0], (grads["t1"].shape[1] + 1) // 2
    acc = grads["t1"].dtype
    w1, b1, b2 = (x.detach().to(acc) for x in (w1, b1, b2))
    if table is None:
        wb, tab = torch.zeros_like(w1), w1.new_zeros(H, 2 * T - 1)
    else:
        wb, tab = w1[:, H:], table.detach().to(acc)
    leaves = [x.clone().requires_grad_() for x in (wb, b1, b2, tab)]
    with torch.enable_grad():
        t1, k0, t2 = dape_v2_tables(torch.cat([w1[:, :H], leaves[0]], dim=1), *leaves[1:], T)
        outs = [(x, grads[n]) for x, n in ((t1, "t1"), (k0, "k0"), (t2, "t2")) if x.requires_grad]  # k0: none at k 1
        torch.autograd.backward(*zip(*outs))
    dwb, db1, db2, dtab = (x.grad for x in leaves)
    dw1 = grads["w1s"] if table is None else torch.cat([grads["w1s"], dwb], dim=1)
    return dw1, db1, grads["w2"], db2, None if table is None else dtab
