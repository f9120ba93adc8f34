"""lenx.ops.dape_v2.chain (the Gluon forward chain: QK once per window for every head, the conv chain,
softmax and PV on chip; only O and LSE written). CPU: its schedule (emulate_chain.chain_schedule)
against the float64 reference, its rounding against the fp32 reference, causality. GPU (sm_90,
triton 3.6): the kernel against the reference in bf16, and its schedule's float path at fp32 inputs."""

import math

import pytest
import torch

from helpers import rel_err
from kernel_cases import dape_v2_case, dape_v2_reference_rows
from lenx.ops.dape_v2 import chain as C
from lenx.ops.dape_v2.emulate_chain import chain_schedule, windows
from lenx.ops.dape_v2.reference import dape_v2_reference


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


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
    q, k, v, w, tab = dape_v2_case(T, 12, 64, 32, ks, kind)
    o, lse = chain_schedule(q, k, v, *w, tab)
    assert o.dtype == torch.float64 and lse.shape == (1, 12, T)
    assert rel_err(o, dape_v2_reference(q, k, v, *w, tab)) < 1e-10
    assert rel_err(lse, _lse_ref(q, k, v, w, tab)) < 1e-10


def test_schedule_without_a_table():
    q, k, v, w, tab = dape_v2_case(111, 3, 16, 8, 3, None)
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
    q, k, v, w, tab = dape_v2_case(300, 12, 64, 32, ks, kind, dtype=torch.bfloat16)
    q32, k32, v32 = (x.float() for x in (q, k, v))
    ref = dape_v2_reference(q32, k32, v32, *w, tab)
    o, lse = chain_schedule(q, k, v, *w, tab, half=torch.float16, p_dtype=torch.bfloat16)
    o32, lse32 = chain_schedule(q32, k32, v32, *w, tab)
    ref_lse = _lse_ref(q32.double(), k32.double(), v32.double(), [x.double() for x in w], tab.double())
    assert rel_err(o.float(), ref) < 1e-2
    assert rel_err(lse32, ref_lse) < 1e-5 < rel_err(lse, ref_lse) < 2e-3


@pytest.mark.parametrize("kind", ["kerple", "alibi", None])
def test_emulated_tables_are_the_kernels(kind):
    """The emulator builds its tables itself (float64 for the exact check); in fp32 they are the
    operands the kernel reads (gluon.prepare, which tables.cached keeps), so both run one definition."""
    from lenx.ops.dape_v2 import gluon as G
    from lenx.ops.dape_v2.emulate_chain import chain_tables
    T, H = 200, 12
    _, _, _, w, tab = dape_v2_case(T, H, 8, 32, 3, kind, dtype=torch.float32)
    t1, k0, t2 = chain_tables(*w, tab, T, H)
    _, _, pt1, pk0, pt2 = G.prepare(*w, tab, T, H, "cpu")
    assert torch.allclose(t1, pt1, rtol=1e-5, atol=1e-5) and torch.allclose(t2, pt2, rtol=1e-5, atol=1e-5)
    assert torch.allclose(k0, pk0[:k0.shape[0]], rtol=1e-5, atol=1e-5)


def test_schedule_is_causal():
    T, t = 130, 63
    q, k, v, w, tab = dape_v2_case(T, 3, 8, 4, 3, "alibi")
    a, la = chain_schedule(q, k, v, *w, tab)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, t + 1:] = torch.randn_like(x[:, :, t + 1:])
    b, lb = chain_schedule(q2, k2, v2, *w, tab)
    assert torch.equal(a[:, :, :t + 1], b[:, :, :t + 1]) and torch.equal(la[..., :t + 1], lb[..., :t + 1])
    assert not torch.equal(a[:, :, t + 1:], b[:, :, t + 1:])


def test_refuses_what_it_does_not_take():
    """The wrapper checks the shape before touching a device (fp32 q, k 5, 16 heads)."""
    q = torch.zeros(1, 12, 8, 64)
    w = [torch.zeros(32, 24, 1, 3), torch.zeros(32), torch.zeros(12, 32, 1, 3), torch.zeros(12)]
    with pytest.raises(NotImplementedError, match="forward chain"):
        C.dape_v2_chain_forward(q, q, q, *w)
    q16 = torch.zeros(1, 16, 8, 64, dtype=torch.bfloat16)
    w16 = [torch.zeros(32, 32, 1, 3), torch.zeros(32), torch.zeros(16, 32, 1, 3), torch.zeros(16)]
    with pytest.raises(NotImplementedError, match="H <= 12"):
        C.dape_v2_chain_forward(q16, q16, q16, *w16)


# ---- GPU: the kernel (sm_90, triton 3.6) ----

def _chain_ready():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        return "needs an sm_90 GPU"
    why = C.unsupported_reason(torch.zeros(1, 12, 1, 64, device="cuda", dtype=torch.bfloat16), 12, 32, 3)
    return why


@pytest.mark.gpu
@pytest.mark.skipif(_chain_ready() is not None, reason=str(_chain_ready()))
@pytest.mark.parametrize("T", [1, 111, 1000, 8192])
@pytest.mark.parametrize("ks,kind", [(3, "kerple"), (3, "alibi"), (1, "alibi"), (3, None)])
def test_gpu_chain_forward(T, ks, kind):
    """bf16 q, k, v against the fp32 reference on the same inputs (every row up to 1000; at 8192 the
    first 64 and last 192 rows), and against gluon.py's kernel (the GPU oracle) on all rows."""
    from lenx.ops.dape_v2 import gluon as G
    q, k, v, w, tab = dape_v2_case(T, 12, 64, 32, ks, kind, dtype=torch.bfloat16, device="cuda")
    o, lse = C.dape_v2_chain_forward(q, k, v, *w, tab)
    torch.cuda.synchronize()
    assert torch.isfinite(o.float()).all() and torch.isfinite(lse).all()
    q32, k32, v32 = (x.float() for x in (q, k, v))
    rows = torch.arange(T, device="cuda") if T <= 1000 else torch.cat(
        [torch.arange(64, device="cuda"), torch.arange(T - 192, T, device="cuda")])
    err = rel_err(o.float()[:, :, rows], dape_v2_reference_rows(q32, k32, v32, w, tab, rows))
    assert err < 1e-2, f"T {T} k {ks} {kind}: rel err {err:.3g} against the reference"
    og, lg = G.dape_v2_gluon_forward(q, k, v, *w, tab)
    assert rel_err(o.float(), og.float()) < 1e-2 and (lse - lg).abs().max().item() < 0.05


@pytest.mark.gpu
@pytest.mark.skipif(_chain_ready() is not None, reason=str(_chain_ready()))
@pytest.mark.parametrize("H,D,ks", [(1, 8, 3), (5, 16, 1), (12, 10, 3), (7, 21, 1)])
def test_gpu_chain_writes_every_output(H, D, ks, monkeypatch):
    """Other head and channel counts at T 111, outputs NaN-poisoned before the launch."""
    q, k, v, w, tab = dape_v2_case(111, H, 64, D, ks, "kerple", dtype=torch.bfloat16, device="cuda", seed=1)
    nan = float("nan")
    monkeypatch.setattr(torch, "empty_like", lambda x, **kw: torch.full_like(x, nan, **kw))
    monkeypatch.setattr(torch, "empty", lambda *shape, **kw: torch.full(shape, nan, **kw))
    o, lse = C.dape_v2_chain_forward(q, k, v, *w, tab)
    monkeypatch.undo()
    torch.cuda.synchronize()
    assert torch.isfinite(o.float()).all() and torch.isfinite(lse).all()
    ref = dape_v2_reference(q.float(), k.float(), v.float(), *w, tab)
    assert rel_err(o.float(), ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(_chain_ready() is not None, reason=str(_chain_ready()))
@pytest.mark.parametrize("t", [0, 63, 64, 150])
def test_gpu_chain_is_causal(t):
    T = 200
    q, k, v, w, tab = dape_v2_case(T, 12, 64, 32, 3, "kerple", dtype=torch.bfloat16, device="cuda", seed=2)
    a, la = C.dape_v2_chain_forward(q, k, v, *w, tab)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, t + 1:] = torch.randn_like(x[:, :, t + 1:]) * 3
    b, lb = C.dape_v2_chain_forward(q2, k2, v2, *w, tab)
    assert torch.equal(a[:, :, :t + 1], b[:, :, :t + 1]) and torch.equal(la[..., :t + 1], lb[..., :t + 1])
    assert not torch.equal(a[:, :, t + 1:], b[:, :, t + 1:])


@pytest.mark.gpu
@pytest.mark.skipif(_chain_ready() is not None, reason=str(_chain_ready()))
@pytest.mark.parametrize("pick,autocast", [(None, True), ("chain", True), ("gluon", True), (None, False)])
def test_gpu_module_eval_routes_to_the_gluon_kernel_asked_for(pick, autocast, monkeypatch):
    """fp32 activations under bf16 autocast, no_grad (as `lenx eval`): by default the warp-specialised
    chain runs, LENX_DAPE_V2_GLUON=chain the chain, =gluon gluon.py's kernel; each matches the dense
    backend. Without autocast (fp32 q, k, v) no Gluon kernel runs."""
    from lenx.attention import Attention, AttentionConfig
    if pick is None:
        monkeypatch.delenv("LENX_DAPE_V2_GLUON", raising=False)
    else:
        monkeypatch.setenv("LENX_DAPE_V2_GLUON", pick)
    torch.manual_seed(0)
    cfg = AttentionConfig(method="dapev2-kerple", backend="dense")
    ref = Attention(cfg, 12, 768).to("cuda")
    fast = Attention(AttentionConfig(**{**cfg.__dict__, "backend": "triton"}), 12, 768).to("cuda")
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(2, 300, 768, device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        y, y_ref = fast(x), ref(x)
    kernels = {m.kernel for m in fast.modules() if isinstance(getattr(m, "kernel", None), str)}
    assert len(kernels) == 1
    if autocast:
        assert kernels == {{None: "gluon (chain_ws)", "chain": "gluon (chain)", "gluon": "gluon"}[pick]}
    else:
        assert not kernels.pop().startswith("gluon")
    assert rel_err(y.float(), y_ref.float()) < 2e-2


def _triton36():
    try:
        import triton
    except ImportError:
        return "no triton"
    return None if triton.__version__.startswith("3.6.") and C._GLUON_ERROR is None else f"triton {triton.__version__}, not 3.6"


@pytest.mark.gpu  # no GPU needed: it runs where the device's triton (3.6) is, i.e. with the GPU suite
@pytest.mark.skipif(_triton36() is not None, reason=str(_triton36()))
@pytest.mark.parametrize("ks", [1, 3])
def test_offline_compile_has_no_spill_in_the_window_loop(ks, tmp_path):
    """sm_90a compile at H 12, D 32: no LDL / STL in the window loop (gluon.py's forward has 51 / 14
    there), shared memory within the 227 KB a CTA may have, and the loop found is the kernel's body."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "tune" / "compile_chain.py"
    spec = importlib.util.spec_from_file_location("compile_chain", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = mod.compile_chain(12, 32, ks, str(tmp_path / "chain.sass"))
    assert res["window_loop"]["loop_instructions"] > 1000
    assert res["window_loop"]["LDL"] == 0 and res["window_loop"]["STL"] == 0, res["window_loop"]
    assert res["shared_bytes"] <= 227 * 1024 and res["ptx_target"] == "sm_90a"
    # instructions a warp issues per window (triton 3.6): 5,266 / 4,526 with LeakyReLU as a maximum,
    # 5,498 / 4,742 with where(y > 0, ..)
    issued = _ablate_chain().window_census((tmp_path / "chain.sass").read_text(), C.BM // 2)["issued"]
    assert issued < {3: 5400, 1: 4650}[ks], issued


# ---- the per-stage ablation of the chain (scripts/tune/ablate_chain.py) ----

def _ablate_chain():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "tune" / "ablate_chain.py"
    spec = importlib.util.spec_from_file_location("ablate_chain", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _kernel_text(src: str) -> str:
    """The text of the chain kernel `_dape_v2_chain` (from its def to the next top-level def)."""
    start = src.index("    def _dape_v2_chain(")
    return src[start: src.index("\ndef kernel():", start)]


def test_ablation_variants_edit_the_chain_once_each():
    """Every variant's edits find their anchors in today's chain.py / gluon.py (each exactly once) and
    give valid Python; base keeps the kernel's text unchanged, every other variant changes it or the
    conv row loop it runs."""
    import ast

    A = _ablate_chain()
    chain_src = A.CHAIN.read_text()
    base = A.variant_source("base")
    assert _kernel_text(base) == _kernel_text(chain_src)
    assert A.conv_rows_source() in base and "def _conv_rows(" in A.conv_rows_source()
    for name in A.VARIANTS:
        text = A.variant_source(name)
        ast.parse(text)
        assert "from .gluon" not in text
        if name != "base":
            assert text != base, name


def test_ablation_anchor_drift_is_a_clear_error(monkeypatch):
    A = _ablate_chain()
    monkeypatch.setitem(A.VARIANTS, "drifted", [("no such line in chain.py", "")])
    with pytest.raises(SystemExit, match="error: variant 'drifted': its edit anchor is found 0 times"):
        A.variant_source("drifted")


def test_ablation_cli_refuses_an_unknown_variant(tmp_path):
    """As a user runs it, from another directory: one line, rc 2, no JSON written."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "tune" / "ablate_chain.py"
    r = subprocess.run([sys.executable, str(script), "-o", "out.json", "--only", "base;no such stage"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: unknown variant 'no such stage'")
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out.json").exists()


@pytest.mark.gpu
@pytest.mark.skipif(_chain_ready() is not None, reason=str(_chain_ready()))
def test_gpu_ablation_base_is_the_chain(tmp_path):
    """The ablation's base (chain.py with its own copy of the conv row loop) computes exactly what
    chain.py's kernel does, and a variant without the convs runs and differs: its times measure the kernel."""
    A = _ablate_chain()
    q, k, v, w, tab = dape_v2_case(300, 12, 64, 32, 3, "kerple", dtype=torch.bfloat16, device="cuda", seed=3)
    o, lse = C.dape_v2_chain_forward(q, k, v, *w, tab)
    ob, lb = A.load_variant("base", tmp_path).dape_v2_chain_forward(q, k, v, *w, tab)
    on, _ = A.load_variant("no step 2 (conv rows)", tmp_path).dape_v2_chain_forward(q, k, v, *w, tab)
    torch.cuda.synchronize()
    assert torch.equal(o, ob) and torch.equal(lse, lb)
    assert not torch.equal(o, on)


# ---- the K/V ring (chain.ring_sizes; emulate_chain.ring_reads replays its protocol) ----

@pytest.mark.parametrize("H", range(1, 13))
def test_ring_protocol_delivers_every_tile(H):
    """Every ring size the kernel takes gives each read the tile it expects, over windows (the items
    ahead cross into the next window), never overwrites an unread tile, never reads one in flight."""
    from lenx.ops.dape_v2.emulate_chain import ring_reads
    assert 2 in C.ring_sizes(H)
    for ring in C.ring_sizes(H):
        reads = ring_reads(H, ring, 3)
        assert len(reads) == 3 * 2 * H and all(e == f for e, f in reads), (H, ring)


@pytest.mark.parametrize("H", range(1, 13))
def test_ring_sizes_refused_are_the_unsafe_ones(H):
    """A size ring_sizes leaves out would deliver a wrong tile (or overwrite one unread): the rule
    is exactly the protocol's condition."""
    from lenx.ops.dape_v2.emulate_chain import ring_reads
    for ring in set((2, 3, 4)) - set(C.ring_sizes(H)):
        try:
            bad = any(e != f for e, f in ring_reads(H, ring, 3))
        except AssertionError:
            bad = True
        assert bad, (H, ring)


def test_chain_refuses_a_ring_it_cannot_run():
    """Before any device work (CPU tensors): a 4-slot ring at H 9 (2 H = 18 is not a multiple of 4)."""
    q = torch.zeros(1, 9, 8, 64, dtype=torch.bfloat16)
    w = [torch.zeros(32, 18, 1, 3), torch.zeros(32), torch.zeros(9, 32, 1, 3), torch.zeros(9)]
    with pytest.raises(ValueError, match=r"ring of 4 slots at H 9 \(takes \(2, 3\)\)"):
        C.dape_v2_chain_forward(q, q, q, *w, ring=4)


@pytest.mark.gpu
@pytest.mark.skipif(_chain_ready() is not None, reason=str(_chain_ready()))
@pytest.mark.parametrize("H,T,ks,kind", [(12, 8192, 3, "kerple"), (6, 300, 1, "alibi"), (9, 111, 3, "kerple")])
def test_gpu_chain_rings_give_the_same_bits(H, T, ks, kind):
    """The ring only changes when K and V tiles arrive: every size the kernel takes at H gives the
    default's output and LSE bit for bit (the default is checked against the reference elsewhere).
    Seven compiles: H 12 rings 3, 4; H 6 rings 2, 3, 4; H 9 rings 2, 3."""
    q, k, v, w, tab = dape_v2_case(T, H, 64, 32, ks, kind, dtype=torch.bfloat16, device="cuda", seed=4)
    o2, l2 = C.dape_v2_chain_forward(q, k, v, *w, tab, ring=2)
    for ring in C.ring_sizes(H)[1:]:
        o, lse = C.dape_v2_chain_forward(q, k, v, *w, tab, ring=ring)
        torch.cuda.synchronize()
        assert torch.equal(o, o2) and torch.equal(lse, l2), f"ring {ring} at H {H}, T {T}"


def test_ablation_window_census_counts_the_pair_loop_per_row_pair():
    """window_census on a made-up SASS: a window loop of 10 instructions (0x10-0xa0) holding the first
    window's copy of the pair loop (4, 0x20-0x50, skipped) and the pair loop (3, 0x60-0x80), run 8
    times: 10 - 4 - 3 + 8 x 3 issued; the copy's barrier and wgmma are not counted."""
    A = _ablate_chain()
    ops = ["NOP", "BAR.SYNC 0x0", "HGMMA.64x64x16", "LDS R0, [R1]", "@P0 BRA 0x20",
           "NOP", "LDG.E R2, [R4]", "@!P1 BRA 0x60",
           "STS [R1], R0", "BRA 0x10", "EXIT"]
    sass = "\n".join(f"        /*{0x10 * (i + 1):04x}*/   {op} ;" for i, op in enumerate(ops))
    c = A.window_census(sass, 8)
    assert c["pair_loop"] == 3 and c["issued"] == 10 - 4 - 3 + 8 * 3
    assert (c["BAR"], c["HGMMA"], c["LDS"], c["LDG"], c["STS"]) == (0, 0, 0, 8, 1)
