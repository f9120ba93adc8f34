"""Issue 45: DAPE V2 with a large bias under each backend and precision against float64:
the relative error of one layer's output (dense, chunked, triton; fp32 and bf16 autocast; no grad, so triton
runs the Gluon forward). Run on a GPU from the repository root: python3 scripts/tune/probe_large_bias.py"""
import torch, sys
sys.path.insert(0, "src")
from lenx.attention import Attention, AttentionConfig
for method, T in [("dapev2-kerple-power", 2048), ("dapev2-alibi", 1536), ("kerple-power", 2048)]:
    torch.manual_seed(0)
    ref = Attention(AttentionConfig(method=method, backend="dense"), 12, 768).cuda().double()
    x = torch.randn(1, T, 768, device="cuda")
    y_ref = ref(x.double())
    for backend in ["dense", "chunked", "triton"]:
        fast = Attention(AttentionConfig(method=method, backend=backend), 12, 768).cuda()
        fast.load_state_dict({n: p.float() for n, p in ref.state_dict().items()})
        for ac in [False, True]:
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=ac):
                y = fast(x)
            err = ((y.double() - y_ref).norm() / y_ref.norm()).item()
            print(method, T, backend, "bf16" if ac else "fp32", getattr(fast.processor, "kernel", None), f"{err:.4f}", flush=True)
