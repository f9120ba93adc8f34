"""Query temperatures (ssmax-, logn-, l4temp-; lenx.attention.temperature): their factors against the
papers' formulas, a float64 dense reference written from them against the dense, chunked and SDPA
paths (forward and backward, T = 1, 63, 111), causality, decoding = full forward (alone and in a
left-padded batch, eager and static steps), the names the grammar takes and refuses, the training
length a run records, and CHE."""

import math
import os
from pathlib import Path
import subprocess
import sys

import pytest
import torch

from helpers import V, assert_close, model_for
import lenx
from lenx.attention import Attention, AttentionConfig, UnknownMethodError, parse_method
from lenx.attention.backends import run_backend, unsupported_reason
from lenx.attention.temperature import QueryTemperature
from lenx.config import ConfigError, load_config

SRC = str(Path(lenx.__file__).resolve().parents[1])
# short enough that every factor moves within a few dozen positions (Llama 4's floor_scale is 8192)
SHORT = dict(temp_train_len=8, temp_floor_scale=4.0, temp_attn_scale=0.3)
METHODS = ["ssmax-rope", "logn-kerple", "l4temp-rope", "ssmax-dapev2-kerple", "logn-nope", "l4temp-xl"]


# --- the factors, as the papers and the models' code write them -------------------------------------

def test_logn_is_qwen_s_log_base_training_length_past_it():
    t = QueryTemperature("logn", 2, train_len=8)
    n = torch.tensor([1, 2, 8, 9, 64, 512])
    want = [1, 1, 1, math.log(9, 8), 2, 3]  # Qwen: log_L(i) for i > L, else 1 (i = 1-based position = n)
    assert torch.allclose(t.position_term(n, torch.float64), torch.tensor(want, dtype=torch.float64))


def test_l4temp_is_llama_4_s_floor_form_with_its_defaults():
    t = QueryTemperature("l4temp", 2)  # floor_scale 8192, attn_scale 0.1
    pos = torch.tensor([0, 8190, 8191, 16383, 24575])  # Llama 4's cache positions
    want = torch.log(torch.floor((pos.double() + 1.0) / 8192) + 1.0) * 0.1 + 1.0
    assert torch.allclose(t.position_term(pos + 1, torch.float64), want)
    assert torch.allclose(want, torch.tensor([1, 1, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3),
                                              1 + 0.1 * math.log(4)], dtype=torch.float64))


def test_ssmax_is_s_h_log_n_with_s_learned_per_head():
    attn = Attention(AttentionConfig(method="ssmax-rope"), 4, 64)
    s = attn.temperature.s
    assert s.shape == (4,) and s.requires_grad and torch.equal(s.detach(), torch.ones(4))  # temp_ssmax_init 1
    assert torch.equal(Attention(AttentionConfig(method="ssmax-kerple", temp_ssmax_init=0.43), 2, 16).temperature.s,
                       torch.full((2,), 0.43))
    q = torch.randn(1, 4, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        s.copy_(torch.tensor([0.5, 1.0, 2.0, 3.0]))
        got = attn.temperature.double()(q, torch.arange(1, 6))
    n = torch.arange(1, 6, dtype=torch.float64)
    assert torch.allclose(got, q * (s.double()[:, None] * n.log())[None, :, :, None])


# --- a float64 reference from the formulas, against every path ----------------------------------------

def reference(attn, x):
    """softmax_j(f_i q_i.k_j / sqrt(d) + b_ij) v_j (or the DAPE processor's scores of f_i q_i.k_j / sqrt(d)),
    f_i written from each paper at position i (n = i + 1 keys), q and k rotated by the module's RoPE."""
    B, T, C = x.shape
    H, d, c = attn.n_head, attn.head_dim, attn.cfg
    q, k, v = attn.qkv(x).view(B, T, 3, H, d).permute(2, 0, 3, 1, 4)
    pos = torch.arange(T)
    if attn.rope is not None:
        q, k = attn.rope(q, k, pos)
    i = pos.double()
    kind = attn.spec.temperature
    if kind == "ssmax":
        f = attn.temperature.s[:, None] * torch.log(i + 1)
    elif kind == "logn":
        f = torch.where(i + 1 > c.temp_train_len, torch.log(i + 1) / math.log(c.temp_train_len), 1.0)[None]
    else:
        f = (torch.log(torch.floor((i + 1) / c.temp_floor_scale) + 1) * c.temp_attn_scale + 1)[None]
    raw = f[..., None] * (q @ k.transpose(-1, -2)) / math.sqrt(d)
    bias = attn.bias(pos, pos, q=f[..., None] * q, k=k) if attn.bias is not None else None
    if attn.processor is not None:
        scores = attn.processor(raw, bias, f[..., None] * q, pos, pos)
    else:
        scores = raw if bias is None else raw + bias
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out = scores.softmax(-1) @ v
    return attn.proj(out.transpose(1, 2).reshape(B, T, C))


def through(attn, x, backend):
    """The module's own projection and temperature, then one backend."""
    B, T, C = x.shape
    q, k, v = attn.project(x)
    out, rem = run_backend(backend, q, k, v, attn.parts, attn.cfg.chunk_size)
    return attn.proj(attn.normaliser.finish(out, rem, v).transpose(1, 2).reshape(B, T, C))


def grads(y, inputs, w):
    return torch.autograd.grad((y * w).sum(), inputs)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("T", [1, 63, 111])
def test_every_path_is_the_reference_forward_and_backward(method, T):
    torch.manual_seed(0)
    attn = Attention(AttentionConfig(method=method, chunk_size=16, dape_hidden=4, **SHORT), 2, 16).double()
    with torch.no_grad():  # parameters off their initial values (s_h, Kerple's, DAPE's)
        for name, p in attn.named_parameters():
            if not name.startswith(("qkv", "proj")):
                p.add_(0.2 * torch.randn_like(p))
    x = torch.randn(2, T, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, T, 16, dtype=torch.float64)
    inputs = [x] + list(attn.parameters())
    want = reference(attn, x)
    want_grads = grads(want, inputs, w)
    cpu = torch.device("cpu")
    backends = [b for b in ("dense", "chunked", "sdpa") if unsupported_reason(b, attn.parts, cpu) is None]
    assert ("sdpa" in backends) == (attn.bias is None and attn.processor is None)
    for backend in backends:
        got = through(attn, x, backend)
        assert_close(got, want, 1e-12, f"{method} {backend} T={T}")
        for a, b in zip(grads(got, inputs, w), want_grads):
            assert_close(a, b, 1e-10, f"{method} {backend} T={T} gradient", floor=1e-3)  # some are exactly 0
    assert_close(attn(x), want, 1e-12, f"{method} planned backend")


def test_scaling_q_moves_the_logits_not_the_bias():
    """logn at L = 8 doubles the q.k logits of position 63 (log_8 64 = 2); Kerple's bias stays."""
    attn = Attention(AttentionConfig(method="logn-kerple", **SHORT), 2, 16).double()
    plain = Attention(AttentionConfig(method="kerple"), 2, 16).double()
    plain.load_state_dict(attn.state_dict())
    x = torch.randn(1, 64, 16, dtype=torch.float64)
    q, k, _ = attn.project(x)
    q0, k0, _ = plain.project(x)
    assert torch.allclose(q[:, :, 63], 2 * q0[:, :, 63]) and torch.equal(q[:, :, :8], q0[:, :, :8])
    assert torch.equal(k, k0)


# --- causality and decoding ----------------------------------------------------------------------------

@pytest.mark.parametrize("method", METHODS)
def test_a_future_token_leaves_the_past_alone(method):
    model = model_for(method, **SHORT)
    idx = torch.randint(0, V, (1, 40))
    changed = idx.clone()
    changed[0, 30] = (changed[0, 30] + 1) % V
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    assert torch.equal(a[:, :30], b[:, :30]) and not torch.allclose(a[:, 30], b[:, 30])


@pytest.mark.parametrize("method", METHODS + ["ssmax-pope"])
def test_decoding_equals_the_full_forward(method):
    model = model_for(method, **SHORT)
    T = 40
    idx = torch.randint(0, V, (2, T))
    with torch.no_grad():
        cache = model.new_cache(2, T)
        steps = [model.prefill(idx[:, :1], cache)] + [model.decode(idx[:, i:i + 1], cache)[:, 0] for i in range(1, T)]
        cache2 = model.new_cache(2, T)
        prompt = model.prefill(idx[:, :25], cache2)
        block = model.decode(idx[:, 25:], cache2)
        for i, logits in enumerate(steps):
            assert_close(logits, model(idx[:, :i + 1])[0][:, -1], 1e-9, f"{method} step {i}")
        assert_close(prompt, model(idx[:, :25])[0][:, -1], 1e-9, f"{method} prompt")
        assert_close(block, model(idx)[0][:, 25:], 1e-9, f"{method} block")


@pytest.mark.parametrize("method", ["ssmax-rope", "logn-dapev2-kerple", "l4temp-nope"])
def test_a_left_padded_batch_decodes_each_prompt_at_its_own_positions(method):
    """Each row's temperature follows its own position (the padding before it is no key), in the
    eager step and the static one (a CUDA graph's)."""
    from lenx.model.decoding import StaticDecoder
    from lenx.model.generate import batch_prompts

    model = model_for(method, **SHORT)
    prompts = [torch.randint(0, V, (n,)) for n in (12, 3, 7)]
    steps = 6

    def run(idx, lengths, static):
        cache = model.new_cache(idx.shape[0], idx.shape[1] + steps)
        logits, tokens = [model.prefill(idx, cache, lengths)], []
        decoder = None
        for _ in range(steps):
            tokens.append(logits[-1].argmax(-1))
            if static:
                decoder = decoder or StaticDecoder(model, cache, "static")
                logits.append(decoder(tokens[-1]))
            else:
                logits.append(model.decode(tokens[-1][:, None], cache)[:, -1])
        return torch.stack(logits, 1), torch.stack(tokens, 1)

    with torch.no_grad():
        alone = []
        for p in prompts:  # alone, each step is the last row of a full forward over the tokens so far
            logits, tokens = run(p[None], None, False)
            seq = torch.cat([p[None], tokens], 1)
            for i in range(steps + 1):
                assert_close(logits[0, i], model(seq[:, :len(p) + i])[0][0, -1], 1e-9, f"{method} alone, step {i}")
            alone.append(logits[0])
        idx, lengths = batch_prompts(prompts, width=model.halo)
        for static in (False, True):
            batch = run(idx, lengths, static)[0]
            for b, want in enumerate(alone):
                assert_close(batch[b], want, 1e-9, f"{method} static={static} prompt {b}")


# --- names, settings, the training length ----------------------------------------------------------------

def test_names_compose_and_the_meaningless_ones_say_why():
    spec = parse_method("SSMax-DAPEv2-Kerple")
    assert (spec.name, spec.temperature, spec.processor, spec.base) == (
        "ssmax-dapev2-kerple", "ssmax", "dapev2", "kerple")
    assert parse_method("logn-dapev2").name == "logn-dapev2-nope" and parse_method("l4temp-pope").base == "pope"
    assert "Scalable-Softmax" in spec.description and "2501.19399" in spec.description
    for name, why in [("logn-stickbreaking", "no denominator"), ("ssmax-dapev2-stickbreaking-alibi", "no denominator"),
                      ("ssmax-cope", "gates"), ("ssmax-logn-rope", "one query temperature"),
                      ("ssmax-kerpel", "Did you mean kerple"), ("ssmax", "unknown method ''")]:
        with pytest.raises(UnknownMethodError, match=why) as e:
            parse_method(name)
        assert "\n" not in str(e.value)


def test_a_run_records_its_training_length_for_log_n():
    assert load_config("tiny", ["model.method=logn-rope", "train.seq_len=48"]).model.temp_train_len == 48
    assert load_config("tiny", ["model.method=logn-rope", "model.temp_train_len=100"]).model.temp_train_len == 100
    with pytest.raises(ValueError, match="temp_train_len >= 2"):
        Attention(AttentionConfig(method="logn-rope"), 2, 16)  # built without a run's length: no silent 1


def _lenx(*args, cwd):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=cwd)


@pytest.mark.parametrize("sets,says", [
    (["model.method=ssmax-rope", "model.temp_ssmax_init=-1"], "model.temp_ssmax_init must be a positive number"),
    (["model.method=l4temp-rope", "model.temp_attn_scale=-0.1"], "model.temp_attn_scale must be >= 0"),
    (["model.method=l4temp-rope", "model.temp_floor_scale=0"], "model.temp_floor_scale must be a positive number"),
    (["model.method=logn-stickbreaking"], "stick-breaking does not fade"),
])
def test_bad_settings_are_one_line_errors_before_any_work(tmp_path, sets, says):
    args = ["train", "-c", "tiny", "-o", "out"]
    for s in sets:
        args += ["--set", s]
    out = _lenx(*args, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("error: ") and says in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_lenx_list_names_the_temperatures_and_pope_with_their_papers(tmp_path):
    out = _lenx("list", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.replace("│", " ").split())
    for words in ("ssmax Scalable-Softmax", "arXiv 2501.19399", "logn Qwen's log-n", "arXiv 2309.16609",
                  "l4temp Llama 4's", "pope PoPE"):
        assert words in text


def test_che_runs_every_temperature(tmp_path):
    from lenx.che.protocol import Encoder, make_config, run_che

    methods = ["ssmax-rope", "logn-kerple", "l4temp-dapev2-kerple"]
    cfg = make_config("smoke", tasks=["parity_check"], methods=methods, steps=2, test_max_length=44,
                      test_length_step=3, test_samples=4, n_layer=1)
    result = run_che(cfg, tmp_path, progress=False)
    assert {r["method"] for r in result["runs"]} == set(methods)
    assert all(math.isfinite(r["final_train_loss"]) for r in result["runs"])
    # bidirectional: every row sees all T keys, so every row takes the factor of n = T (log-n's L: the task length)
    attn = Encoder("logn-kerple", 4, 2, cfg).blocks[0].attn
    assert not attn.cfg.causal and attn.temperature.train_len == cfg.train_max_length
    ref = Encoder("kerple", 4, 2, cfg).blocks[0].attn
    ref.load_state_dict(attn.state_dict())
    x = torch.randn(1, 80, cfg.d_model)
    with torch.no_grad():
        q, q0 = attn.project(x)[0], ref.project(x)[0]
    assert torch.allclose(q, q0 * math.log(80) / math.log(cfg.train_max_length), rtol=1e-6)


# --- on a GPU: the fused kernels and fused SDPA, unchanged, run the temperatures -----------------------

@pytest.mark.gpu
@pytest.mark.parametrize("method,backend", [("ssmax-kerple", "triton"), ("logn-dapev2-kerple", "triton"),
                                            ("l4temp-alibi", "flex"), ("ssmax-rope", "sdpa"), ("logn-pope", "sdpa")])
@pytest.mark.parametrize("T", [63, 256])
def test_the_gpu_backends_run_the_temperatures_unchanged(method, backend, T):
    import copy

    ref = Attention(AttentionConfig(method=method, backend="dense", **SHORT), 3, 96).cuda()
    fast = copy.deepcopy(ref)
    fast.cfg = AttentionConfig(method=method, backend=backend, **SHORT)
    assert fast.backend_for(torch.device("cuda")) == backend
    x = torch.randn(2, T, 96, device="cuda", requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y_ref, y = ref(x), fast(x2)
    assert_close(y, y_ref, 1e-3, f"{method} {backend} forward")
    g = torch.randn_like(y)
    y_ref.backward(g)
    y.backward(g)
    assert_close(x2.grad, x.grad, 1e-3, f"{method} {backend} dx")
    for (name, p_ref), (_, p) in zip(ref.named_parameters(), fast.named_parameters()):
        if p_ref.grad is not None:  # conv2's bias adds a constant to a row: its exact gradient is 0, so an absolute floor
            floor = 1.0 if name.endswith("conv2.bias") else 1e-3
            assert_close(p.grad, p_ref.grad, 1e-3, f"{method} {backend} {name}", floor=floor)
