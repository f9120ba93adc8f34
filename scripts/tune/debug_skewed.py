"""Localise a GPU-only mismatch of the skewed conv kernels: each raw output of _conv_fwd/_conv_bwd
(F buffer, dS buffer, dW1, dW2, dt1, dk0, dt2) against autograd of reference.dape_v2_scores_tabled, fed
the kernel's own S and G buffers (SKEWED_MODULE: another copy of the module to check).
Usage: PYTHONPATH=src python3 scripts/tune/debug_skewed.py"""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import torch
import triton

from lenx.ops._launch import pow2
import importlib
from lenx.ops.dape_v2.reference import dape_v2_scores_tabled, dape_v2_tables

skewed = importlib.import_module(os.environ.get("SKEWED_MODULE", "lenx.ops.dape_v2.skewed"))
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run(B, H, T, D, ks, dtype, tiles):
    torch.manual_seed(0)
    d = 64
    q, k = (torch.randn(B, H, T, d, device=dev, dtype=dtype) for _ in range(2))
    w1 = torch.randn(D, 2 * H, 1, ks, device=dev) * 0.3
    b1, b2 = torch.randn(D, device=dev) * 0.1, torch.randn(H, device=dev) * 0.1
    w2 = torch.randn(H, D, 1, ks, device=dev) * 0.3
    table = -torch.rand(H, 1, device=dev) * torch.log1p(torch.arange(2 * T - 1, device=dev).sub(T - 1).abs())
    t1, k0, t2 = dape_v2_tables(w1, b1, b2, table, T)
    cfg = dict(skewed.CONFIG if dtype != torch.float32 else skewed.CONFIG_FP32, conv_fwd=tiles, conv_bwd=tiles)
    wts = skewed._Weights(w1[:, :H], t1, k0, w2, dtype)
    sb = skewed._scores_buffer(q, k, cfg)
    fb = skewed._conv_buffer(sb, wts, cfg, False)  # F itself (no residual form)
    pos = torch.arange(T, device=dev)
    causal = pos[None, :] <= pos[:, None]
    gb = (torch.randn(B, H, T, T, device=dev) * causal).to(dtype)
    # kernel backward
    BM, BN, nw, ns = tiles
    n_band = triton.cdiv(T, BN)
    KSP = pow2(ks, 1)
    dsb = torch.full_like(sb, float("nan"))
    dw1 = torch.full((B * n_band, wts.KP, wts.DP), float("nan"), device=dev)
    dw2 = torch.full((B * n_band, wts.KP, wts.DP), float("nan"), device=dev)
    dt1 = torch.zeros(B, 2 * T - 1, wts.DP, device=dev)
    dk0 = torch.zeros(B, max(ks // 2, 1), T, wts.DP, device=dev)
    dt2 = torch.full((B, T, wts.HP), float("nan"), device=dev)
    skewed._conv_bwd[(n_band, B)](sb, gb, dsb, wts.t1, wts.k0, wts.w1c, wts.w1t, wts.w2c, dw1, dw2, dt1, dk0, dt2, T,
                                  KSP=KSP, BM=BM, BN=BN, CDT=skewed._tl_dtype(wts.w1c.dtype),
                                  PREC="ieee" if dtype == torch.float32 else "tf32", num_warps=nw, num_stages=ns,
                                  **wts.meta())
    if dev.type == "cuda":
        torch.cuda.synchronize()
    # reference on the same (rounded) inputs
    S = sb.float().masked_fill(~causal, 0).requires_grad_()
    w1s, t1r, k0r, w2r = (x.detach().clone().requires_grad_() for x in (w1[:, :H], t1, k0, w2))
    L = dape_v2_scores_tabled(S, w1s, t1r, k0r, w2r, torch.zeros_like(t2), pos, pos) - S
    Fref = L.detach()
    g = gb.float() * causal
    dS, gw1, gt1, gk0, gw2 = torch.autograd.grad(L, [S, w1s, t1r, k0r, w2r], g)
    dS = dS + g
    D_, HP, KS = wts.D, wts.HP, ks
    got_w1 = dw1.sum(0)[:KS * HP].view(KS, HP, -1)[:, :H, :D_].permute(2, 1, 0).unsqueeze(2)
    got_w2 = dw2.sum(0)[:KS * HP].view(KS, HP, -1)[:, :H, :D_].permute(1, 2, 0).unsqueeze(2)
    got_t1 = dt1.sum(0)[:, :D_].T
    got_k0 = dk0.sum(0)[:ks // 2, :, :D_].permute(0, 2, 1)

    def err(a, b):
        return f"{((a.float() - b).norm() / b.norm().clamp(min=1e-9)).item():.1e}"

    print(f"{skewed.__name__.split('.')[-1]} B{B} H{H} T{T} D{D} k{ks} {dtype} tiles {tiles}: F {err(fb[..., causal], Fref[..., causal])} "
          f"dS {err(dsb[..., causal], dS[..., causal])} dW1 {err(got_w1, gw1)} dW2 {err(got_w2, gw2)} "
          f"dt1 {err(got_t1, gt1)} dk0 {err(got_k0, gk0) if ks > 1 else '-'} "
          f"nan dw1 {dw1.isnan().any().item()} dw2 {dw2.isnan().any().item()}", flush=True)


CASES = [(2, 16, 17, 32, 5), (2, 12, 200, 32, 3), (2, 16, 100, 64, 3), (1, 2, 128, 8, 7)]
for B, H, T, D, ks in CASES:
    for dtype in (torch.float32, torch.bfloat16):
        for tiles in ((8, 16, 8, 1),):
            try:
                run(B, H, T, D, ks, dtype, tiles)
            except Exception as e:  # noqa: BLE001
                print("ERROR", B, H, T, D, ks, dtype, tiles, repr(e)[:200], flush=True)
                if "illegal" in repr(e):
                    sys.exit(1)
