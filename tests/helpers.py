"""Shared test helpers."""

import math

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-6) -> float:
    """|a - b| / |b|, with |b| floored: some exact gradients are zero (a softmax is blind to a
    per-row constant, e.g. DAPE's conv2 bias), and their rounding noise is not an error."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp(min=floor))


def assert_close(a, b, tol=1e-5, what="", floor=1e-6):
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert torch.isfinite(a).all(), f"{what}: non-finite values"
    err = rel_err(a, b, floor)
    assert err < tol, f"{what}: relative error {err:.2e} >= {tol:.0e}"


V = 37  # the vocabulary of model_for's models


def model_for(method: str, **overrides):
    """A tiny float64 LM of `method` in eval mode, its parameters moved off their initial values."""
    from lenx.config import LMConfig
    from lenx.model import LM

    torch.manual_seed(0)
    # mta_every=1: MTA's query-key convolution on both layers (the paper's every 4th would skip them)
    shape = dict(vocab_size=V, n_layer=2, n_head=2, d_model=16, dape_hidden=4, chunk_size=16, cope_npos=8, mta_every=1)
    cfg = LMConfig(method=method, **(shape | overrides))
    model = LM(cfg).double().eval()
    with torch.no_grad():  # parts that start at zero (CoPE's embeddings, a remainder vector) would test nothing
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def decode_steps_and_block(model, idx, prompt=25, end=36):
    """Logits of idx [B, T] decoded token by token after a one-token prefill ([T] of [B, vocab]), the
    cache they filled, and the logits of the block idx[:, prompt:end] decoded in one call after a
    prefill of idx[:, :prompt] (a prompt longer than a small window's ring)."""
    T = idx.shape[1]
    with torch.no_grad():
        cache = model.new_cache(idx.shape[0], T)
        steps = [model.prefill(idx[:, :1], cache)] + [model.decode(idx[:, i:i + 1], cache)[:, 0] for i in range(1, T)]
        long = model.new_cache(idx.shape[0], T)
        model.prefill(idx[:, :prompt], long)
        block = model.decode(idx[:, prompt:end], long)
    return steps, cache, block


def assert_static_step_decodes(model, lengths=(3, 17, 9), steps=12):
    """A left-padded batch of prompts of `lengths`, read by prefill, then `steps` tokens through the
    fixed-shape step (StaticDecoder): each row's logits equal the forward of its prompt and the
    tokens read so far, alone (float64)."""
    from lenx.model.decoding import StaticDecoder
    from lenx.model.generate import batch_prompts

    prompts = [torch.randint(0, V, (n,)).tolist() for n in lengths]
    idx, widths = batch_prompts(prompts, width=model.halo)
    tokens = torch.randint(0, V, (len(prompts), steps))
    with torch.no_grad():
        cache = model.new_cache(len(prompts), idx.shape[1] + steps)
        model.prefill(idx, cache, widths)
        decoder = StaticDecoder(model, cache, "static")
        got = [decoder(tokens[:, i]).clone() for i in range(steps)]
        for b, prompt in enumerate(prompts):
            full = torch.cat([torch.tensor(prompt), tokens[b]])[None]
            for i in range(steps):  # the forward of what the step has read, its last row
                want = model(full[:, :len(prompt) + i + 1])[0][0, -1]
                assert_close(got[i][b], want, 1e-9, f"{model.cfg.method} sequence {b} step {i}")


def stick_loop(q, k, v, attend_current):
    """Direct product of sticks in float64: the nearest key breaks the stick first."""
    B, H, T, d = q.shape
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros(B, H, T, d, dtype=torch.float64)
    rem = torch.ones(B, H, T, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                left = 1.0
                last = i if attend_current else i - 1
                for j in range(last, -1, -1):
                    beta = torch.sigmoid(q[b, h, i] @ k[b, h, j] / math.sqrt(d))
                    out[b, h, i] += left * beta * v[b, h, j]
                    left = left * (1 - beta)
                rem[b, h, i] = left
    return out, rem


def eval_result(method, ppl: dict, delta_p: dict, seed=None, train_len=64) -> dict:
    """An eval.json-like result: perplexity per length, ΔP where given; with `seed`, one seed's."""
    rows = {str(L): {"ppl": p} for L, p in ppl.items()}
    for L, d in delta_p.items():
        rows[str(L)]["delta_p"] = d
    r = {"method": method, "train_len": train_len, "scored": 32, "window_note": "16 windows", "results": rows}
    return r if seed is None else {**r, "seed": seed}


WORDS = "river stone light north garden paper silver window market orchard".split()


def words_corpus(root):
    """A tiny text corpus `words` under `root` (60 documents of 400 random words and a number; BPE of
    300): the haystack of the retrieval and suite tests."""
    import json

    import numpy as np

    from lenx.data import open_corpus
    from lenx.data.build import prepare_corpus

    rng = np.random.default_rng(0)
    path = root / "texts.jsonl"
    with open(path, "w") as f:
        for _ in range(60):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS, 400)) + " 0123456789."}) + "\n")
    prepare_corpus("words", root, from_path=path, vocab_size=300, progress=False)
    return open_corpus("words", root)
