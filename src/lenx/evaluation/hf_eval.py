"""`lenx eval --hf DIR`: lenx's protocol on any local transformers causal LM.

The windows are lenx's (evaluate.py): drawn from the corpus in the corpus's tokens, nested, the same
for every model, so an HF model's results sit in one `lenx compare` with lenx's runs. The model reads
each window's text in its own tokens (text.py: the corpus's ids as they are when its tokenizer is
the corpus's, else the text re-tokenized); lengths, the training length of ΔP and the scored
tokens count the corpus's tokens, and the model's own token counts are recorded beside them
(per window: the tokens read at each length, the scored tokens and ΔP's, and the bytes these cover).

Per length: "ppl" is exp of the mean over windows of each window's mean NLL per model token
(lenx's own perplexity when the tokenizer is the corpus's), "bpb" the mean over windows of each
window's scored NLL in bits over the bytes its scored tokens cover, comparable across tokenizers.
Results go to an output folder (default runs/hf/<name>) with a meta.json that names the model, its
config summary (RoPE scaling included) and its tokenizer.
"""

import json
import math
from pathlib import Path
import re
import sys

import numpy as np

from ..config import ConfigError, EvalConfig, resolve_device
from ..data import DataError, open_corpus
from ..fileio import check_writable_dir, check_writable_file, write_json
from ..runs import check_run_corpus, run_config
from . import positions
from .evaluate import _positive_int, _rounded, check_options, default_lengths, eval_windows_with_documents
from .files import kept_note, write_evaluation
from .hf import HFReader, check_folder, config_summary, default_train_len, load_model, quiet, tokenizer_summary
from .text import Retokenized, SameTokens, byte_lengths, token_bytes

KIND = "hf"


def _evaluated(run: Path, name: str) -> dict:
    """What a run's latest evaluation file `name` measured on (lengths, windows, scored tokens, split,
    eval seed), where it has a readable one; {} otherwise."""
    try:
        result = json.loads((Path(run) / name).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(result, dict):
        return {}
    out = {}
    lengths = result.get("lengths")
    if isinstance(lengths, list) and lengths and all(isinstance(L, int) and L > 0 for L in lengths):
        out["lengths"] = lengths
    for key in ("windows", "scored", "eval_seed", "seed"):
        if isinstance(result.get(key), int) and not isinstance(result.get(key), bool):
            out[key] = result[key]
    if isinstance(result.get("split"), str):
        out["split"] = result["split"]
    return out


def hf_settings(config, like=None, corpus=None, data_root=None, lengths=None, windows=None, scored=None,
                train_len=None, task: str | None = None) -> dict:
    """Corpus, data root, split, eval seed, windows, scored tokens, lengths and training length of an
    evaluation of an HF model: those of the run `like` (its corpus, and the settings of its latest
    evaluation of this kind, else of its eval section), or lenx's defaults on `corpus`; the options
    override them."""
    check_options(lengths, windows, scored)
    if train_len is not None:
        _positive_int("--train-len", train_len)
    T = train_len or default_train_len(config)
    if T is None:
        raise ConfigError("the model's config.json gives no training length (max_position_embeddings); give --train-len")
    if like is not None:
        if corpus is not None or data_root is not None:
            raise ConfigError("--like takes the corpus from the run; give --corpus (and --data-root) or --like, not both")
        cfg = run_config(like)
        e, name, root = cfg.eval, cfg.data.corpus, Path(cfg.data.root)
        done = _evaluated(like, f"eval_{task}.json" if task else "eval.json")
        split, seed = done.get("split", e.split), done.get("seed" if task else "eval_seed", e.seed)
        windows, scored = windows or done.get("windows", e.windows), scored or done.get("scored", e.scored)
        if lengths is None:
            lengths = done.get("lengths") or e.lengths or default_lengths(cfg.train.seq_len, e.max_length,
                                                                           0 if task else scored)
    else:
        if corpus is None:
            raise ConfigError("--hf needs the corpus to evaluate on: --corpus NAME (prepared under --data-root) or "
                              "--like RUN (the corpus and windows of a lenx run)")
        e, name, root = EvalConfig(), corpus, Path(data_root or "data")
        split, seed, windows, scored = e.split, e.seed, windows or e.windows, scored or e.scored
        if lengths is None:
            lengths = default_lengths(T, e.max_length, 0 if task else scored)
    if not lengths:
        raise ConfigError(f"no evaluation length: the model's training length {T} is above {e.max_length}; give --lengths")
    lengths = sorted(set(lengths))
    if not task and lengths[0] < scored:
        raise ConfigError(f"evaluation length {lengths[0]} is shorter than the {scored} scored tokens; "
                          f"use lengths >= {scored} or a smaller --scored")
    return {"corpus": name, "root": root, "train_len": T, "lengths": lengths, "windows": windows, "scored": scored,
            "split": split, "eval_seed": seed}


def text_corpus(like=None, corpus=None, data_root=None):
    """The corpus to evaluate on, before the model folder is read: the one the run `like` was
    trained on (refused when it was prepared anew since, as `lenx eval RUN` refuses it), or
    --corpus under `data_root`; a one-line error for a token-level corpus, which has no text for a
    transformers model to read."""
    if like is not None and (corpus is not None or data_root is not None):
        raise ConfigError("--like takes the corpus from the run; give --corpus (and --data-root) or --like, not both")
    if like is not None:
        cfg = run_config(like)
        found = open_corpus(cfg.data.corpus, Path(cfg.data.root))
        check_run_corpus(like, cfg, found)
        where = f"--like {like} was trained on the token-level corpus {found.name!r}"
    elif corpus is not None:
        found = open_corpus(corpus, Path(data_root or "data"))
        where = f"corpus {found.name!r} is token-level"
    else:
        raise ConfigError("--hf needs the corpus to evaluate on: --corpus NAME (prepared under --data-root) or "
                          "--like RUN (the corpus and windows of a lenx run)")
    if found.tokenizer() is None:
        raise DataError(f"{where}: --hf reads text in the model's own tokens, so it needs a text corpus (a run "
                        "trained on one, or --corpus NAME of one)")
    return found


def check_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", name or ""):
        raise ConfigError(f"bad --name {name!r}: use letters, digits, '_', '-', '+' or '.' (it names the model in "
                          "tables and its default output folder)")
    return name


def output_folder(out: Path | None, name: str) -> Path:
    return Path(out) if out is not None else Path("runs") / KIND / name


def check_output(out: Path, file_name: str) -> None:
    """Before any work: the output folder can take the evaluation, and is not a lenx run's."""
    check_writable_dir(out, "--out")
    if (out / "config.toml").exists():
        raise ConfigError(f"--out {out} is a lenx run folder; give the HF model's evaluation a folder of its own")
    check_writable_file(out / file_name, "the evaluation file")


class _Prepared:
    """What both routes share: the checked model folder, settings, corpus, converter and device."""

    def __init__(self, model_dir, out, name, device, task=None, **options):
        self.model_dir = Path(model_dir)
        self.corpus = text_corpus(options.get("like"), options.get("corpus"), options.get("data_root"))
        self.config, self.tokenizer = check_folder(self.model_dir)
        self.settings = hf_settings(self.config, task=task, **options)
        self.name = check_name(name or self.model_dir.resolve().name)
        self.out = output_folder(out, self.name)
        self.device = resolve_device(device, "--device")
        table = token_bytes(self.corpus)
        self.tokenizer_info = tokenizer_summary(self.tokenizer, self.corpus)
        self.convert = SameTokens(self.corpus, byte_lengths(self.corpus)) if self.tokenizer_info["same_as_corpus"] \
            else Retokenized(self.corpus, self.tokenizer, table)

    def header(self, reader) -> dict:
        s = self.settings
        return {"kind": KIND, "run": str(self.out), "model": str(self.model_dir.resolve()), "method": self.name,
                "train_len": s["train_len"], "corpus": self.corpus.name, "corpus_fingerprint": self.corpus.fingerprint(),
                "step": None, "steps": None, "finished": True, "hf_config": config_summary(self.config),
                "tokenizer": self.tokenizer_info, "dtype": str(reader.dtype).removeprefix("torch."),
                "attention": getattr(reader.model.config, "_attn_implementation", None), "device": str(self.device)}

    def load(self, texts) -> HFReader:
        """The model, once its inputs are known to fit it: token sequences (ModelText, or arrays of
        ids) whose last token is only predicted, so the model reads all but that one."""
        ids = [t if isinstance(t, np.ndarray) else t.ids for t in texts]
        top, vocab = max(int(x.max(initial=0)) for x in ids), self.config.vocab_size
        if top >= vocab:
            raise ConfigError(f"the model's tokenizer gives token id {top}, but its embedding has {vocab} rows: "
                              "the folder's tokenizer is not the model's")
        longest_input = max(len(x) for x in ids) - 1
        reader = load_model(self.model_dir, self.device)
        limit = reader.position_limit()
        if limit is not None and longest_input > limit:
            raise ConfigError(f"the longest input is {longest_input} of the model's tokens, but its learned position "
                              f"table holds {limit}; evaluate at shorter --lengths")
        return reader

    def write(self, file_name: str, result: dict) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        kept = write_evaluation(self.out / file_name, result)
        if kept is not None:
            print(kept_note(self.out / file_name, kept, result), file=sys.stderr)
        write_json(self.out / "meta.json", {
            "kind": KIND, "model": result["model"], "method": self.name, "hf_config": result["hf_config"],
            "tokenizer": self.tokenizer_info, "vocab_size": int(self.config.vocab_size),
            "corpus": self.corpus.name, "corpus_fingerprint": result["corpus_fingerprint"]})


def _bar(progress: bool, total: int, what: str):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=what, unit="window", dynamic_ncols=True)


def evaluate_hf(model_dir: Path, corpus: str | None = None, data_root: Path | None = None, like: Path | None = None,
                out: Path | None = None, name: str | None = None, lengths: list[int] | None = None,
                windows: int | None = None, scored: int | None = None, train_len: int | None = None,
                device: str = "auto", token_budget: int | None = None, progress: bool = True,
                write: bool = True, per_position: bool = False) -> dict:
    """Perplexity at every length, ΔP and bits per byte of an HF model (the module docstring);
    writes eval.json and meta.json into `out`. Every option and the model folder are checked before
    the weights are loaded. per_position: also the mean NLL per position of the model's tokens at
    the longest length, binned (lenx.evaluation.positions), from the same forward passes."""
    check_options(token_budget=token_budget)
    p = _Prepared(model_dir, out, name, device, corpus=corpus, data_root=data_root, like=like, lengths=lengths,
                  windows=windows, scored=scored, train_len=train_len)
    s = p.settings
    lengths, scored, T = s["lengths"], s["scored"], s["train_len"]
    if write:
        check_output(p.out, "eval.json")
    data, note, documents = eval_windows_with_documents(p.corpus, s["split"], max(lengths), s["windows"], s["eval_seed"])
    n, delta_k = data.shape[1], min(T, lengths[0])
    texts = [p.convert.convert(w) for w in data]
    # where each window's scored tokens and ΔP's tokens start among the model's tokens
    j = [max(int(t.first[n - scored]), 1) for t in texts]
    d = [max(int(t.first[n - delta_k]), 1) for t in texts]
    empty = [i for i, t in enumerate(texts) if max(j[i], d[i]) >= len(t.ids)]
    if empty:  # the last tokens are a character cut short by the window's end, which no model token holds
        raise DataError(f"window {empty[0]}'s last {min(scored, delta_k)} corpus tokens hold no whole character of "
                        "text for the model's tokenizer; score more tokens (--scored) or evaluate at other lengths")

    def starts(L):  # the first model token read at length L (one earlier if a region would lack context)
        return [max(0, min(int(t.first[max(0, n - (L + 1))]), j[i] - 1, d[i] - 1)) for i, t in enumerate(texts)]

    reads = lengths + ([T] if T not in lengths else [])
    reader = p.load([t.ids[s0:] for t, s0 in zip(texts, starts(max(reads)))])
    budget = token_budget or (65536 if p.device.type == "cuda" else 8192)
    bar = _bar(progress, len(texts) * len(reads), f"eval {p.name}")
    nll_at, read_tokens = {}, {}
    for L in reads:
        s0 = starts(L)
        seqs = [t.ids[a:] for t, a in zip(texts, s0)]
        rows = reader.read(seqs, [1] * len(seqs), budget, on_batch=None if bar is None else bar.update)
        nll_at[L] = [(r[0].astype(np.float64), a) for r, a in zip(rows, s0)]
        read_tokens[L] = [len(q) - 1 for q in seqs]  # the model reads all but the last, which it predicts
    if bar is not None:
        bar.close()

    def region(L, at):  # per window: the NLLs of the model tokens from `at` on, read at length L
        return [nll[at[i] - a - 1:] for i, (nll, a) in enumerate(nll_at[L])]

    scored_bytes = [t.bytes_from(k) for t, k in zip(texts, j)]
    short = np.array([x.mean() for x in region(T, d)])
    per_length = {}
    for L in lengths:
        parts = region(L, j)
        means = np.array([x.mean() for x in parts])
        row = {"ppl": math.exp(means.mean()), "ppl_full": math.exp(np.mean([x.mean() for x, _ in nll_at[L]])),
               "nll": float(means.mean()), "window_nll": _rounded(means),
               "bpb": float(np.mean([x.sum() / max(b, 1) for x, b in zip(parts, scored_bytes)]) / math.log(2)),
               "input_tokens": read_tokens[L]}
        if L > T:
            tail = np.array([x.mean() for x in region(L, d)])
            row["delta_p"] = math.exp(short.mean()) - math.exp(tail.mean())
            row["delta_p_window_nll"] = _rounded(tail)
        per_length[str(L)] = row
    result = p.header(reader) | {
        "lengths": lengths, "windows": s["windows"], "scored": scored, "split": s["split"], "eval_seed": s["eval_seed"],
        "window_note": note, "window_documents": documents.tolist(),
        "window_distinct_documents": len(np.unique(documents)), "delta_p_tokens": delta_k,
        "in_distribution": {"length": T, "tokens": delta_k, "ppl": math.exp(short.mean()), "window_nll": _rounded(short)},
        # the model's tokens and the bytes they cover, per window, of the scored tokens and of ΔP's
        "window_tokens": {"scored": [len(t.ids) - k for t, k in zip(texts, j)],
                          "delta_p": [len(t.ids) - k for t, k in zip(texts, d)]},
        "window_bytes": {"scored": scored_bytes, "delta_p": [t.bytes_from(k) for t, k in zip(texts, d)]},
        "results": per_length}
    if per_position:
        rows = positions.model_token_rows([nll for nll, _ in nll_at[max(lengths)]])
        result["per_position"] = positions.per_position(rows, "corpus tokens" if p.convert.same else "model tokens")
    if write:
        p.write("eval.json", result)
    return result


def _passkey_cell(reader, convert, cases, budget) -> dict:
    import torch

    from ..model.generate import generate

    exact, logprob = [], []
    for case in cases:
        ids = convert.convert(case["input"]).ids
        answer = convert.encode(f" {case['key']}")
        nll = reader.read([np.concatenate([ids, answer])], [len(ids)], budget)[0][0]
        logprob.append(-float(nll.astype(np.float64).mean()))
        prompt = torch.from_numpy(ids)[None].to(reader.device)
        with quiet():
            new = generate(reader, prompt, len(answer) + 2, temperature=0)["tokens"][0]
        digits = "".join(c for c in convert.decode(new.tolist()) if c.isdigit())[:5]
        exact.append(float(digits == case["key"]))
    return {"exact": float(np.mean(exact)), "logprob": float(np.mean(logprob))}


def _copy_cell(reader, convert, cases, budget) -> dict:
    acc = []
    for case in cases:
        text = convert.convert(case["input"])
        at = max(int(text.first[len(case["input"]) - len(case["targets"])]), 1)  # the copied rest, in model tokens
        pred = reader.read([text.ids], [at], budget)[0][1]
        acc.append(float((pred == text.ids[at:]).mean()))
    return {"accuracy": float(np.mean(acc))}


def evaluate_hf_task(model_dir: Path, task: str, corpus: str | None = None, data_root: Path | None = None,
                     like: Path | None = None, out: Path | None = None, name: str | None = None,
                     lengths: list[int] | None = None, depths: list[float] | None = None, samples: int | None = None,
                     train_len: int | None = None, device: str = "auto", progress: bool = True,
                     write: bool = True) -> dict:
    """A retrieval task (lenx.evaluation.retrieval: passkey or copy) on an HF model: the inputs of
    lenx's runs (lengths in the corpus's tokens), read as text in the model's tokens; writes
    eval_<task>.json and meta.json into `out`."""
    from . import retrieval

    if samples is not None:
        _positive_int("samples", samples)
    if task not in retrieval.TASKS:
        from .suite import is_suite

        if is_suite(task):   # the RULER-style / BABILong-style suite (lenx.evaluation.suite_hf)
            from .suite_hf import evaluate_hf_suite

            return evaluate_hf_suite(model_dir, task, corpus, data_root, like, out, name, lengths, depths, samples,
                                     train_len, device, progress, write)
        raise ConfigError(f"--task must be one of passkey, copy, ruler, babilong or suite task names, got {task!r}")
    depths = list(retrieval.DEPTHS if depths is None else depths)
    if not depths or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x <= 1 for x in depths):
        raise ConfigError(f"depths must be numbers in [0, 1], got {depths!r}")
    p = _Prepared(model_dir, out, name, device, task=task, corpus=corpus, data_root=data_root, like=like,
                  lengths=lengths, train_len=train_len)
    s, samples = p.settings, samples or 8
    file_name = f"eval_{task}.json"
    if write:
        check_output(p.out, file_name)
    make = retrieval.passkey_inputs if task == "passkey" else retrieval.copy_inputs
    cells = {(L, x): make(p.corpus, s["split"], L, x, samples, s["eval_seed"]) for L in s["lengths"] for x in depths}
    # the longest input, with room for the passkey's answer (at most 6 model tokens) and the tokens
    # generated after it: the model reads up to 7 tokens past the prompt
    reader = p.load([np.append(p.convert.convert(c["input"]).ids, np.zeros(8, dtype=np.int64))
                     for cases in cells.values() for c in cases])
    budget = 65536 if p.device.type == "cuda" else 8192
    bar = _bar(progress, len(cells), f"{task} {p.name}")
    grid: dict[str, list[list[float]]] = {}
    for (L, x), cases in cells.items():
        cell = (_passkey_cell if task == "passkey" else _copy_cell)(reader, p.convert, cases, budget)
        for key, value in cell.items():
            grid.setdefault(key, [[] for _ in s["lengths"]])[s["lengths"].index(L)].append(value)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    chance = 1 / 90000 if task == "passkey" else 1 / len(p.tokenizer)
    result = p.header(reader) | {"task": task, "lengths": s["lengths"], "depths": depths, "samples": samples,
                                 "seed": s["eval_seed"], "split": s["split"], **grid, "chance": chance}
    if write:
        p.write(file_name, result)
    return result
