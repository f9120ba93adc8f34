"""Long-context evaluation with the DAPE V2 paper's protocol.

For every length L, the model reads whole length-L windows cut from held-out documents and we report
the perplexity of the last `scored` tokens (256 in the paper), so every length scores the same number
of tokens. Windows are nested: the window of length L is the last L tokens of one fixed window of the
longest length, so at every L the very same tokens are scored and only the context before them grows.
The windows depend only on the corpus, the split and eval.seed, never on the method.

DeltaP (seed appendix A) at L > T_train: P(M(x[-T_train:]), T_train) - P(M(x), T_train), where
P(M(x), K) is the perplexity of the last K tokens after reading x. Positive: the extra context helps.
"""

import json
import math
from pathlib import Path
import sys

import numpy as np
import torch
from torch.nn import functional as F

from ..config import ConfigError, resolve_device
from ..model import LM
from ..model.checkpoint import weights_step
from ..model.precision import autocast_for
from ..runs import load_model, open_run_corpus, run_config, run_weights
from . import positions
from .batches import halving_batches
from .files import describe, write_evaluation


def default_lengths(train_len: int, max_length: int, scored: int = 0) -> list[int]:
    """Powers of two times the training length up to max_length, from the first that holds the
    scored window (training at 128 with 256 scored tokens starts at 256)."""
    lengths, L = [], train_len
    while L < scored:
        L *= 2
    while L <= max_length:
        lengths.append(L)
        L *= 2
    return lengths


def eval_windows(corpus, split: str, longest: int, count: int, seed: int) -> tuple[np.ndarray, str]:
    """`count` windows of longest + 1 tokens (inputs plus next-token targets), seeded. Windows come
    from single documents at least that long when there are enough; otherwise from the split's token
    stream (documents joined by EOS), which the returned note says."""
    windows, note, _ = eval_windows_with_documents(corpus, split, longest, count, seed)
    return windows, note


def distinct_picks(picks: np.ndarray, n: int, seed: int) -> np.ndarray:
    """`picks` (indices into n items, drawn with replacement) with every repeat after an item's first
    pick replaced by an item not picked, drawn by `seed`, when there are enough items; picks without
    a repeat are returned as they are."""
    picks = np.array(picks)
    _, first = np.unique(picks, return_index=True)
    repeat = np.setdiff1d(np.arange(len(picks)), first)
    if len(repeat) and n >= len(picks):
        unused = np.setdiff1d(np.arange(n), picks)
        picks[repeat] = np.random.default_rng([seed, 1]).permutation(unused)[:len(repeat)]
    return picks


def eval_windows_with_documents(corpus, split: str, longest: int, count: int, seed: int):
    """eval_windows, and the document of each window's scored end (its index in the split): the
    unit that bootstrap intervals resample (lenx.report.stats). When the split has at least `count`
    documents long enough, every window comes from a document of its own (the windows of shorter
    lengths are nested in these, so they do too)."""
    tokens, docs = corpus.tokens(split), corpus.docs(split)
    need = longest + 1
    rng = np.random.default_rng(seed)
    long_docs = docs[docs[:, 1] >= need]
    if len(long_docs) >= min(count, 8):
        pick = rng.integers(0, len(long_docs), size=count)
        where = rng.random(count)  # where in its document each window starts
        # Seeded draws with replacement, as always; a document drawn twice gives way to one not
        # drawn when there are enough, so windows already in distinct documents stay as they were.
        picks = long_docs[distinct_picks(pick, len(long_docs), seed)]
        starts = picks[:, 0] + (where * (picks[:, 1] - need + 1)).astype(np.int64)
        note = f"{count} windows from {len(np.unique(picks[:, 0]))} held-out documents of >= {need} tokens"
    else:
        if len(tokens) < need:
            raise ConfigError(f"the {split} split has {len(tokens)} tokens, fewer than the longest evaluation "
                              f"window ({need}); evaluate at shorter lengths (--lengths) or prepare more data")
        starts = rng.integers(0, len(tokens) - need + 1, size=count)
        note = (f"{count} windows from the joined {split} stream: only {len(long_docs)} documents have >= {need} "
                "tokens, so windows may cross document boundaries")
    last = starts + need - 1  # the document holding a window's last target
    doc_of = np.searchsorted(docs[:, 0], last, side="right") - 1
    windows = np.stack([np.asarray(tokens[s:s + need], dtype=np.int64) for s in starts])
    return windows, note, doc_of.astype(np.int64)


def token_nll(model: LM, x: torch.Tensor, y: torch.Tensor, last: int) -> torch.Tensor:
    """Per-token negative log-likelihood of the last `last` targets, [B, last] fp32 (the LM head runs
    in slices so the [B, L, vocab] logits never exist at once)."""
    h = model.hidden(x)[:, -last:]
    out = []
    for s in range(0, last, 1024):
        logits = model.lm_head(h[:, s:s + 1024]).float()
        out.append(F.cross_entropy(logits.transpose(1, 2), y[:, -last:][:, s:s + 1024], reduction="none"))
    return torch.cat(out, 1)


def _forward_nll(model, windows: np.ndarray, L: int, last: int, device, precision: str, budget: int, bar=None):
    """NLL [N, last] of the last `last` targets of every window cut to length L, batched to the token
    budget; on CUDA out-of-memory the batch halves and the slice is retried."""
    def read(start, stop):
        chunk = torch.from_numpy(windows[start:stop, -(L + 1):]).to(device)
        with torch.no_grad(), autocast_for(device, precision):
            return token_nll(model, chunk[:, :-1], chunk[:, 1:], last).cpu()

    rows = []
    for start, stop, part in halving_batches(len(windows), max(1, budget // L), read):
        rows.append(part)
        if bar is not None:
            bar.update(stop - start)
    return torch.cat(rows)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_options(lengths=None, windows=None, scored=None, token_budget=None, step=None) -> None:
    """Explicit evaluation options (None: the run's default) must be positive integers."""
    if lengths is not None:
        if not isinstance(lengths, (list, tuple)) or not lengths or any(
                isinstance(L, bool) or not isinstance(L, int) or L < 1 for L in lengths):
            raise ConfigError(f"lengths must be positive integers (at least one), got {lengths!r}")
    for name, value in (("windows", windows), ("scored", scored), ("token_budget", token_budget), ("step", step)):
        if value is not None:
            _positive_int(name, value)


def eval_settings(cfg, lengths: list[int] | None = None, windows: int | None = None,
                  scored: int | None = None) -> dict:
    """What an evaluation of a run with config `cfg` measures: lengths, windows, scored tokens,
    split and window seed, from the options (None: the config's eval section). A ConfigError
    names a value that cannot be evaluated."""
    check_options(lengths, windows, scored)
    e, T_train = cfg.eval, cfg.train.seq_len
    windows = _positive_int("eval.windows", e.windows) if windows is None else windows
    scored = _positive_int("eval.scored", e.scored) if scored is None else scored
    if lengths is None:
        lengths = e.lengths or default_lengths(T_train, e.max_length, scored)
        if not lengths:
            raise ConfigError(f"no evaluation length: eval.max_length {e.max_length} is below the training length "
                              "or the scored window")
        check_options(lengths=lengths)
    lengths = sorted(set(lengths))
    if lengths[0] < scored:
        raise ConfigError(f"evaluation length {lengths[0]} is shorter than the {scored} scored tokens; "
                          f"use lengths >= {scored} or a smaller --scored")
    return {"lengths": lengths, "windows": windows, "scored": scored, "split": e.split, "eval_seed": e.seed}


def result_name(step: int | None = None, rope_scaling: str | None = None, task: str | None = None) -> str:
    """eval.json, or eval_<task>_step<N>_rope-<scaling>.json with the parts that apply."""
    parts = ["eval"] + ([task] if task else []) + ([f"step{step}"] if step is not None else []) + (
        [f"rope-{rope_scaling}"] if rope_scaling else [])
    return "_".join(parts) + ".json"


def run_label(cfg) -> str | None:
    """A name for figures when the method alone would not tell runs apart: a RoPE model trained
    (fine-tuned) with a context extension."""
    if cfg.model.rope_scaling != "none":
        return f"{cfg.model.label}+{cfg.model.rope_scaling} fine-tuned"
    return None


def apply_rope_scaling(cfg, scaling: str | None, factor: float | None) -> dict | None:
    """Set a RoPE context extension on cfg.model (for a model trained without one): `factor` None or
    0 is auto (evaluation length / training length). Returns what to record, or None."""
    from ..attention.layouts import layer_methods
    from ..attention.methods import parse_method
    from ..model import check_config

    if scaling is None:
        return None
    m = cfg.model
    if all(parse_method(name).base != "rope" for name in layer_methods(m.method, m.layers, m.n_layer)):
        raise ConfigError(f"--rope-scaling applies to RoPE models; {m.label} has no RoPE")
    if m.rope_scaling != "none":
        raise ConfigError(f"this run was trained with model.rope_scaling={m.rope_scaling}; --rope-scaling would replace it")
    m.rope_scaling, m.rope_scaling_factor = scaling, factor or 0.0
    m.rope_train_len = m.rope_train_len or cfg.train.seq_len
    check_config(cfg)  # the scaling's name and factor, with the rest of the config
    return {"kind": scaling, "factor": m.rope_scaling_factor or "auto", "train_len": m.rope_train_len,
            "beta_fast": m.rope_yarn_beta_fast, "beta_slow": m.rope_yarn_beta_slow}


def _checkpoint(run_dir: Path, cfg, step: int | None) -> tuple[Path, int | None, bool | None]:
    """(weights folder, its step, whether training had finished) of the last checkpoint or the one
    kept at `step`; a warning on stderr when the last one is of an unfinished (or unknown) step."""
    folder = run_weights(run_dir, step)
    at_step, total = weights_step(folder), cfg.train.steps
    finished = None if at_step is None else at_step >= total
    if step is None and at_step is None:
        print(f"warning: the step of {run_dir}'s checkpoint is unknown (its weights do not say and state.pt is "
              "unreadable): it may be an unfinished model", file=sys.stderr)
    elif step is None and not finished:
        print(f"warning: {run_dir} has trained to step {at_step} of {total} only: these numbers are of an "
              f"unfinished model (finish it with `lenx train --resume {run_dir}`)", file=sys.stderr)
    return folder, at_step, finished


def _header(run_dir: Path, cfg, at_step, finished, scaling: dict | None, corpus) -> dict:
    """What every evaluation file says about what it evaluated."""
    head = {"run": str(run_dir), "method": cfg.model.label, "train_len": cfg.train.seq_len,
            "corpus": cfg.data.corpus, "corpus_fingerprint": corpus.fingerprint(), "step": at_step,
            "steps": cfg.train.steps, "finished": finished}
    if scaling is not None:
        head |= {"label": f"{cfg.model.label}+{scaling['kind']}", "rope_scaling": scaling}
    elif run_label(cfg):
        head["label"] = run_label(cfg)
    return head


def _write(run_dir: Path, name: str, result: dict) -> None:
    """Write an evaluation file; an earlier evaluation there with other settings is kept beside it
    (lenx.evaluation.files), which a note on stderr says."""
    kept = write_evaluation(run_dir / name, result)
    if kept is not None:
        try:
            what = describe(json.loads(kept.read_text()))
        except (OSError, ValueError, AttributeError):
            what = "not a readable evaluation"
        print(f"note: {run_dir / name} held an evaluation with other settings ({what}); kept it as {kept}",
              file=sys.stderr)


def _rounded(window_means) -> list[float]:
    return [round(x, 6) for x in window_means.tolist()]


def _window_bytes(corpus, data: np.ndarray, nll_at: dict, scored: int, delta_k: int, per_length: dict) -> dict:
    """For a text corpus: each length's bits per byte ("bpb": the mean over windows of the scored
    tokens' NLL in bits over their bytes) and the bytes of each window's scored tokens and of ΔP's
    (so that `lenx compare` can put models with other tokenizers beside this one, per byte)."""
    if corpus.tokenizer() is None:
        return {}
    from .text import byte_lengths, tail_bytes

    sizes = byte_lengths(corpus)
    scored_bytes = tail_bytes(sizes, data, scored)
    per_window = torch.tensor(scored_bytes, dtype=torch.float64).clamp(min=1)
    for L, nll in nll_at.items():
        per_length[str(L)]["bpb"] = (nll[:, -scored:].double().sum(1) / per_window).mean().item() / math.log(2)
    return {"window_bytes": {"scored": scored_bytes, "delta_p": tail_bytes(sizes, data, delta_k)}}


def evaluate(run_dir: Path, lengths: list[int] | None = None, windows: int | None = None, scored: int | None = None,
             device: str = "auto", backend: str | None = None, token_budget: int | None = None,
             progress: bool = True, write: bool = True, step: int | None = None, rope_scaling: str | None = None,
             rope_scaling_factor: float | None = None, per_position: bool | None = None) -> dict:
    """Evaluate a run's last checkpoint (or the one it kept at `step`) and write eval.json (or
    eval_step<N>.json; with rope_scaling, eval_rope-<scaling>.json); an evaluation there with other
    settings is kept beside it as eval.<key>.json (lenx.evaluation.files). Options left None take the
    run's eval section; every option is checked before anything is loaded, and the corpus must be
    the one the run was trained on (lenx.runs.check_run_corpus). eval.json records the
    checkpoint's step and whether training had finished; a warning on stderr says when it had not.
    rope_scaling: evaluate a RoPE model with a context extension (attention/rope.py) applied at every
    length, without retraining; the fused SDPA path stays in use. per_position (None: eval.per_position):
    also the mean NLL per position of the longest windows, binned (lenx.evaluation.positions), from
    the same forward passes."""
    run_dir = Path(run_dir)
    check_options(lengths, windows, scored, token_budget, step)
    cfg = run_config(run_dir)
    scaling = apply_rope_scaling(cfg, rope_scaling, rope_scaling_factor)
    settings = eval_settings(cfg, lengths, windows, scored)
    lengths, windows, scored = settings["lengths"], settings["windows"], settings["scored"]
    e, T_train = cfg.eval, cfg.train.seq_len
    dev = resolve_device(device, "device")
    corpus = open_run_corpus(run_dir, cfg)
    folder, at_step, finished = _checkpoint(run_dir, cfg, step)
    model = load_model(cfg, folder, dev, backend)
    budget = token_budget or e.token_budget or (65536 if dev.type == "cuda" else 8192)
    data, note, documents = eval_windows_with_documents(corpus, e.split, max(lengths), windows, e.seed)
    delta_k = min(T_train, lengths[0])

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=windows * (len(lengths) + (T_train not in lengths)), desc=f"eval {cfg.model.method}", unit="window", dynamic_ncols=True)
    nll_at = {L: _forward_nll(model, data, L, L, dev, cfg.train.precision, budget, bar) for L in lengths}
    # The reference for DeltaP: the last T_train tokens read with only T_train tokens of input
    # (with nested windows it is the L = T_train forward itself when that length is evaluated).
    short = nll_at[T_train][:, -delta_k:] if T_train in nll_at else \
        _forward_nll(model, data, T_train, delta_k, dev, cfg.train.precision, budget, bar)
    per_length = {}
    for L, nll in nll_at.items():
        row = {
            "ppl": math.exp(nll[:, -scored:].double().mean().item()),
            "ppl_full": math.exp(nll.double().mean().item()),
            "nll": nll[:, -scored:].double().mean().item(),
            # one mean NLL of the scored tokens per window: what bootstrap intervals resample
            "window_nll": _rounded(nll[:, -scored:].double().mean(1)),
        }
        if L > T_train:
            tail = nll[:, -delta_k:].double()
            row["delta_p"] = math.exp(short.double().mean().item()) - math.exp(tail.mean().item())
            # ΔP's second term per window, so intervals over documents need no second evaluation
            row["delta_p_window_nll"] = _rounded(tail.mean(1))
        per_length[str(L)] = row
    if bar is not None:
        bar.close()
    extra = _window_bytes(corpus, data, nll_at, scored, delta_k, per_length)
    if cfg.eval.per_position if per_position is None else per_position:
        extra["per_position"] = positions.per_position(nll_at[max(lengths)].numpy())
    result = _header(run_dir, cfg, at_step, finished, scaling, corpus) | {
        **settings, "window_note": note, "window_documents": documents.tolist(),
        # windows are nested, so the windows of every length come from these many documents
        "window_distinct_documents": len(np.unique(documents)), "delta_p_tokens": delta_k,
        # in distribution: the last delta_p_tokens of each window read with T_train tokens of input
        # (ΔP's first term), per window like every length
        "in_distribution": {"length": T_train, "tokens": delta_k, "ppl": math.exp(short.double().mean().item()),
                            "window_nll": _rounded(short.double().mean(1))},
        **extra, "backends": model.backends(dev), "device": str(dev), "results": per_length}
    if write:
        _write(run_dir, result_name(step, rope_scaling), result)
    return result


def evaluate_task(run_dir: Path, task: str, lengths: list[int] | None = None, depths: list[float] | None = None,
                  samples: int | None = None, device: str = "auto", backend: str | None = None,
                  step: int | None = None, rope_scaling: str | None = None, rope_scaling_factor: float | None = None,
                  progress: bool = True, write: bool = True) -> dict:
    """A retrieval task (lenx.evaluation.retrieval: passkey or copy) on a grid of lengths x depths; writes
    eval_<task>.json (with _step<N> / _rope-<scaling> as for evaluate). lengths default to powers of
    two from the training length to eval.max_length; inputs are seeded by eval.seed, the same for
    every method."""
    from . import retrieval

    run_dir = Path(run_dir)
    if task not in retrieval.TASKS:
        from .suite import GENERATORS, is_suite
        from .suite_eval import evaluate_suite

        if is_suite(task):   # RULER-style / BABILong-style suite (lenx.evaluation.suite)
            return evaluate_suite(run_dir, task, lengths, depths, samples, device, backend, step, rope_scaling,
                                  rope_scaling_factor, progress, write)
        raise ConfigError(f"--task must be one of passkey, copy, ruler, babilong or a comma list of "
                          f"{', '.join(retrieval.TASKS + tuple(GENERATORS))}, got {task!r}")
    check_options(lengths, None, None, None, step)
    if samples is not None:
        _positive_int("samples", samples)
    depths = list(retrieval.DEPTHS if depths is None else depths)
    if not depths or any(isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= 1 for d in depths):
        raise ConfigError(f"depths must be numbers in [0, 1], got {depths!r}")
    cfg = run_config(run_dir)
    scaling = apply_rope_scaling(cfg, rope_scaling, rope_scaling_factor)
    e, T_train = cfg.eval, cfg.train.seq_len
    lengths = sorted(set(lengths or e.lengths or default_lengths(T_train, e.max_length)))
    dev = resolve_device(device, "device")
    corpus = open_run_corpus(run_dir, cfg)
    folder, at_step, finished = _checkpoint(run_dir, cfg, step)
    model = load_model(cfg, folder, dev, backend)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(lengths) * len(depths), desc=f"{task} {cfg.model.method}", unit="cell", dynamic_ncols=True)
    grid = retrieval.run_task(model, corpus, task, lengths, depths, samples or 8, e.seed, e.split, dev,
                              lambda: autocast_for(dev, cfg.train.precision),
                              progress=None if bar is None else (lambda *_: bar.update(1)))
    if bar is not None:
        bar.close()
    result = _header(run_dir, cfg, at_step, finished, scaling, corpus) | {
        **grid, "chance": retrieval.chance(task, corpus.vocab_size), "backends": model.backends(dev),
        "device": str(dev)}
    if write:
        _write(run_dir, result_name(step, rope_scaling, task), result)
    return result
