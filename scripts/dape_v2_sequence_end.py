"""DAPE V2 at a sequence's end: how far row r of a forward over T tokens (the "full form", what
training and perplexity see) is from the last row of a forward over r + 1 tokens (the "prefix
form", what decoding gives), on CPU in float64.

    PYTHONPATH=src python scripts/dape_v2_sequence_end.py                 # tiny random models
    PYTHONPATH=src python scripts/dape_v2_sequence_end.py --run RUN --data DATA_ROOT

With --run (a trained DAPE V2 run folder and the root of its prepared corpus) it also prints the
validation loss of both forms, and the full forward's logits under two other definitions of the
sequence's end, written here as stand-ins for the reference formula (dense backend only):
A "causal": conv1's output zeroed past the diagonal, so every row is the prefix form;
B "open": keys past the end read as keys past the diagonal (conv1 output leaky(b1 + ...)), so every
row is the full form. Both make a row independent of the forward's length."""

import argparse
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def variant(kind):
    """dape_v2_scores under definition `kind` ("causal" or "open"), for unmasked causal forwards."""
    def scores_fn(scores, bias, w1, b1, w2, b2, q_pos=None, k_pos=None, leak=False, key_valid=None, visible=None):
        assert not leak and key_valid is None and visible is None, "the variants cover plain causal forwards"
        Tq, Tk = scores.shape[-2:]
        x = scores if bias is None else torch.cat([scores, bias.to(scores.dtype).expand_as(scores)], 1)
        k_pos = torch.arange(Tk) if k_pos is None else k_pos
        q_pos = k_pos[Tk - Tq:] if q_pos is None else q_pos
        future = (k_pos[None, :] > q_pos[:, None])
        half = w1.shape[-1] // 2
        x = x.masked_fill(future, 0.0)
        if kind == "open":  # half more keys past the end, all past the diagonal: zero input, b1 output
            x = F.pad(x, (0, half))
        hidden = F.leaky_relu(F.conv2d(x, w1, b1, padding=(0, half)), 0.01)
        if kind == "causal":
            hidden = hidden.masked_fill(future, 0.0)
        f = F.conv2d(hidden, w2, b2, padding=(0, half))[..., :Tk]
        out = scores + f
        return out if bias is None else out + bias
    return scores_fn


def random_models(T):
    from helpers import V, model_for

    torch.manual_seed(1)
    idx = torch.randint(0, V, (2, T))
    for method, k in [("dapev2-kerple", 3), ("dapev2-kerple", 5), ("dapev2-nope", 3), ("dapev2-alibi", 3),
                      ("dapev2-kerple", 1), ("kerple", None)]:
        model = model_for(method, **({} if k is None else {"dape_kernel": k}))
        with torch.no_grad():
            full = model(idx)[0]
            gaps = [float((full[:, r] - model(idx[:, :r + 1])[0][:, -1]).abs().max()) for r in range(T - 1)]
        print(f"{method:14s} k {k}: max |full row r - prefix last row| {max(gaps):.3g}, mean over rows "
              f"{sum(gaps) / len(gaps):.3g} (logits up to {float(full.abs().max()):.3g})")


def trained(run, data, n):
    import lenx.attention.dape as dape
    from lenx.data.corpus import open_corpus
    from lenx.runs import load_run

    model, _ = load_run(Path(run), torch.device("cpu"), backend="dense")
    model = model.double()
    toks = open_corpus(Path(data).name, Path(data).parent).tokens("val")
    original = dape.dape_v2_scores
    for T in (64, 256):
        torch.manual_seed(0)
        starts = torch.randint(0, len(toks) - T - 1, (n,)).tolist()
        seq = torch.stack([torch.as_tensor(toks[s:s + T + 1].astype("int64")) for s in starts])
        x, y = seq[:, :T], seq[:, 1:]
        rows = list(range(1, T, 1 if T <= 64 else 8))
        with torch.no_grad():
            full = model(x)[0]
            pre = torch.stack([model(x[:, :r + 1])[0][:, -1] for r in rows], 1)

            def loss(logits, targets):
                return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)))
            gap = (pre - full[:, rows]).abs().amax(-1)
            agree = float((pre.argmax(-1) == full[:, rows].argmax(-1)).double().mean())
            print(f"T {T}: loss full form {loss(full[:, rows], y[:, rows]):.4f}, prefix form "
                  f"{loss(pre, y[:, rows]):.4f} ({len(rows)} rows x {n}); max |logit gap| {float(gap.max()):.3g}, "
                  f"mean {float(gap.mean()):.3g}; argmax agree {agree:.4f}")
            for kind in ("causal", "open"):
                dape.dape_v2_scores = variant(kind)
                try:
                    other = model(x)[0]
                finally:
                    dape.dape_v2_scores = original
                d = (other - full).abs().amax(-1)
                print(f"  {kind:6s}: loss {loss(other, y):.4f} (current {loss(full, y):.4f}); max |logit change| rows "
                      f"< T - 1 {float(d[:, :-1].max()):.3g}, row T - 1 {float(d[:, -1].max()):.3g}; argmax agree "
                      f"{float((other.argmax(-1) == full.argmax(-1)).double().mean()):.4f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, default=24, help="forward length for the random models")
    p.add_argument("--run", help="a trained DAPE V2 run folder (CPU, float64, dense backend)")
    p.add_argument("--data", help="the prepared corpus folder of --run (default data/synthetic)")
    p.add_argument("--n", type=int, default=8, help="validation sequences per length with --run")
    a = p.parse_args()
    random_models(a.T)
    if a.run:
        trained(a.run, a.data or "data/synthetic", a.n)


if __name__ == "__main__":
    main()
