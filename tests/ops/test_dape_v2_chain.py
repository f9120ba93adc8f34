"""lenx.ops.dape_v2.chain (the Gluon forward chain: QK once per window for every head, the conv chain,
softmax and PV on chip; only O and LSE written). CPU: its schedule (emulate_chain.chain_schedule)
against the float64 reference, its rounding against the fp32 reference, causality. GPU (sm_90,
triton 3.6): the kernel against the reference in bf16, and its schedule's float path at fp32 inputs."""

import math

import pytest
import torch

from helpers import rel_err
from kernel_cases import bias_table
from lenx.ops.dape_v2 import chain as C
from lenx.ops.dape_v2.emulate_chain import chain_schedule, windows
from lenx.ops.dape_v2.reference import dape_v2_reference


@pytest.fixture(autouse=True)
def one_thread():
    """Hundreds of tiny ops per call: OpenMP's fork-join per op costs more than the op on 2 busy cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _case(T, H, d, D, ks, kind, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, T, d, generator=g).to(device, dtype) for _ in range(3))
    tab = bias_table(kind, H, T)
    tab = None if tab is None else tab.detach().to(device, torch.float64 if dtype == torch.float64 else torch.float32)
    Cin = 2 * H if tab is not None else H
    w = [torch.randn(D, Cin, 1, ks, generator=g) * 0.3, torch.randn(D, generator=g) * 0.1,
         torch.randn(H, D, 1, ks, generator=g) * 0.3, torch.randn(H, generator=g) * 0.1]
    wt = torch.float64 if dtype == torch.float64 else torch.float32
    return q, k, v, [x.to(device, wt) for x in w], tab


def _lse_ref(q, k, v, w, tab):
    """ln sum_j exp(logit_ij) from the dense reference: the output of v = one-hot rows is P itself, so
    use the scores path instead: the reference's logits through dape_v2_scores."""
    from lenx.ops.biased_softmax.reference import table_bias
    from lenx.ops.dape_v2.reference import dape_v2_scores
    T = q.shape[-2]
    pos = torch.arange(T)
    S = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    A = dape_v2_scores(S, None if tab is None else table_bias(tab, pos, pos), *w, pos, pos)
    return A.masked_fill(pos[None, :] > pos[:, None], float("-inf")).logsumexp(-1)


@pytest.mark.parametrize("kind", ["kerple", "alibi"])
@pytest.mark.parametrize("ks", [3, 5])
@pytest.mark.parametrize("T", [1, 63, 111, 300])
def test_schedule_matches_reference_fp64(T, ks, kind):
    """H 12, d 64, D 32: the schedule (16-row programs, 64-key windows with a 2h-key halo each side, the
    first window's k0, the residual hidden map, online softmax over windows) is the reference to 1e-10:
    T 1 is one window, T 300 nineteen programs of up to seven windows (k 5: a 56-key step)."""
    q, k, v, w, tab = _case(T, 12, 64, 32, ks, kind)
    o, lse = chain_schedule(q, k, v, *w, tab)
    assert o.dtype == torch.float64 and lse.shape == (1, 12, T)
    assert rel_err(o, dape_v2_reference(q, k, v, *w, tab)) < 1e-10
    assert rel_err(lse, _lse_ref(q, k, v, w, tab)) < 1e-10


def test_schedule_without_a_table():
    q, k, v, w, tab = _case(111, 3, 16, 8, 3, None)
    assert tab is None
    assert rel_err(chain_schedule(q, k, v, *w, None)[0], dape_v2_reference(q, k, v, *w, None)) < 1e-10


def test_windows_cover_every_key_once():
    """Each key up to a program's last row is the output of exactly one window (k 1, 3, 5)."""
    for ks in (1, 3, 5):
        h = ks // 2
        for q0, T in [(0, 1), (0, 300), (288, 300), (16, 40)]:
            owned = [j for ws in windows(q0, T, ks) for j in range(ws + 2 * h, ws + 64 - 2 * h)]
            last = min(q0 + 16, T) - 1
            assert sorted(j for j in owned if j <= last) == list(range(last + 1))


@pytest.mark.parametrize("ks,kind", [(3, "kerple"), (5, "alibi")])
def test_schedule_rounding(ks, kind):
    """The kernel's rounding points (fp16 S used for conv1 AND the logits, fp16 z and f, bf16 P) on
    bf16 inputs: within 1e-2 of the fp32 reference on the same inputs (the GPU bar), and the fp16 S in
    the logits is visible in the lse (its error is above the fp32 path's)."""
    q, k, v, w, tab = _case(300, 12, 64, 32, ks, kind, dtype=torch.bfloat16)
    q32, k32, v32 = (x.float() for x in (q, k, v))
    ref = dape_v2_reference(q32, k32, v32, *w, tab)
    o, lse = chain_schedule(q, k, v, *w, tab, half=torch.float16, p_dtype=torch.bfloat16)
    o32, lse32 = chain_schedule(q32, k32, v32, *w, tab)
    ref_lse = _lse_ref(q32.double(), k32.double(), v32.double(), [x.double() for x in w], tab.double())
    assert rel_err(o.float(), ref) < 1e-2
    assert rel_err(lse32, ref_lse) < 1e-5 < rel_err(lse, ref_lse) < 2e-3


def test_schedule_is_causal():
    T, t = 130, 63
    q, k, v, w, tab = _case(T, 3, 8, 4, 3, "alibi")
    a, la = chain_schedule(q, k, v, *w, tab)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, t + 1:] = torch.randn_like(x[:, :, t + 1:])
    b, lb = chain_schedule(q2, k2, v2, *w, tab)
    assert torch.equal(a[:, :, :t + 1], b[:, :, :t + 1]) and torch.equal(la[..., :t + 1], lb[..., :t + 1])
    assert not torch.equal(a[:, :, t + 1:], b[:, :, t + 1:])
