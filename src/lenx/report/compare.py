"""Compare methods over training seeds: perplexity with intervals over documents and seeds.

Each run's eval.json keeps one mean NLL per window and length ("window_nll") and the document of
each window ("window_documents"). The windows depend only on the corpus, split, eval seed, window
count and lengths, never on the method or the training seed, so runs evaluated alike are measured on
the very same windows: a method's seeds are pooled window by window, and two methods are compared
pairwise on the same resamples of documents (lenx.report.stats).

Per method and length the point estimate is the seed-mean perplexity, the mean over seeds of each
seed's exp(mean window NLL), and every interval covers both the documents and the training seeds
(two seeds of one method can differ by more than a document-only interval allows): a method's
perplexity (stats.method_interval, on the NLL scale and exponentiated, so never below zero), its ΔP
(stats.same_seeds_difference: each seed's two terms are the same model's) and its difference to a
reference method (stats.method_difference); a method of one seed gets an interval over documents
only, marked "covers": "documents only" (windows from one document: "seeds only"; both: "nothing",
and such a difference excludes nothing). Differences come with the seed-to-seed spreads, the
document win rate, the documents that carry most of the difference and those whose removal alone
changes the verdict. ΔP (P(M(x[-T_train:]), T_train) - P(M(x), T_train), evaluation/evaluate.py)
and the in-distribution perplexity (its first term) get intervals from the seeds whose eval.json
keeps both terms per window ("in_distribution" and each length's "delta_p_window_nll"); where no
seed's does (an older lenx eval), the method's "delta_p_note" says so.

Results of models with different tokenizers (`lenx eval --hf`, lenx.evaluation.hf_eval) are on the
same windows, but an NLL per token of one tokenizer is not one of another: then every figure is in
bits per byte of the text the scored tokens cover ("unit": "bpb"; each window's NLL times its tokens
over its bytes, / ln 2, from eval.json's "window_tokens" and "window_bytes"), and ΔP is the
difference in bits per byte; the report says so in one line. Otherwise ("unit": "ppl") perplexity.

Numpy only: comparing runs loads no model and no torch.
"""

import errno
import json
from pathlib import Path
import re
import tomllib

import numpy as np

from ..fileio import OutputError, check_writable_file, write_json, written_by
from .effective import RULE, perplexity_effective, suite_effective
from .positions import method_curves
from .stats import (document_shares, document_win_rate, leave_one_document_out, method_difference, method_interval,
                    same_seeds_difference, window_summary)

MIN_RESAMPLES = 100
WINDOW_KEYS = ("corpus", "split", "eval_seed", "scored", "lengths", "window_documents")  # what fixes the windows
NO_DELTA_P = ("no run's eval.json keeps ΔP's terms per window (an older lenx eval); evaluate again with "
              "`lenx eval RUN` for ΔP and in-distribution intervals")


WRITTEN_BY = "lenx compare"  # the marker of compare's JSON: `lenx compare --out` overwrites only such a file


class CompareError(ValueError):
    """Runs that cannot be compared; the message is one line for the user."""


def is_compare_output(path: Path) -> bool:
    """Whether `path` holds JSON that `lenx compare` wrote: its marker, or (before the marker) the
    keys compare_runs always wrote."""
    return written_by(path, WRITTEN_BY, {"level", "resamples", "reference", "methods", "differences", "runs", "windows",
                                          "documents"})


def check_out(out: Path, named: bool, force: bool) -> str | None:
    """Whether compare may write `out`: a new file; a file of an earlier compare when the user named
    it (--out) or passed --force; never a file lenx compare did not write (a CompareError), nor a
    path that cannot be written. An earlier comparison in the default compare.json without --force
    is kept: the refusal is returned, for after the table is shown."""
    out = Path(out)
    if out.is_dir():
        raise CompareError(f"--out {out} is a folder; give a file name such as {out / 'compare.json'}")
    try:
        check_writable_file(out, "--out")
    except OutputError as e:
        raise CompareError(str(e)) from None
    if not out.exists() and not out.is_symlink():
        return None
    if not is_compare_output(out):
        raise CompareError(f"{out} exists and was not written by lenx compare; lenx does not overwrite it: "
                           "choose another --out, or move that file away")
    if not named and not force:
        return (f"{out} holds an earlier comparison; pass --force to replace it, or --out FILE to write this one "
                "elsewhere (the table above was not saved)")
    return None


def find_runs(paths: list[Path]) -> list[Path]:
    """The run folders that `paths` name: a folder with an eval.json is a run; a folder without one
    stands for each of its subfolders that has one (a sweep's --out), in name order, skipping the
    runs a sweep moved aside (<name>.old-<time>). A run named twice counts once."""
    runs, seen = [], set()
    for path in map(Path, paths):
        if not path.is_dir():
            raise CompareError(f"{path} is not a folder (give run folders or folders of runs)")
        if (path / "eval.json").is_file():
            found = [path]
        else:
            found = sorted(p for p in path.iterdir() if p.is_dir() and (p / "eval.json").is_file()
                           and ".old-" not in p.name and not p.name.startswith("."))
            if not found:
                raise CompareError(f"{path} has no eval.json and no subfolder with one; evaluate runs with "
                                   "`lenx eval RUN` first")
        for run in found:
            key = run.resolve()
            if key not in seen:
                seen.add(key)
                runs.append(run)
    if not runs:
        raise CompareError("no run to compare: give run folders or folders of runs")
    return runs


def _training_seed(run_dir: Path) -> int | None:
    """train.seed of the run's config.toml; without a readable one, the <seed> of a folder named
    <method>-s<seed> (lenx sweep --seeds); else None."""
    try:
        seed = tomllib.loads((run_dir / "config.toml").read_text())["train"]["seed"]
        if isinstance(seed, int) and not isinstance(seed, bool):
            return seed
    except (OSError, ValueError, KeyError, TypeError):
        pass
    match = re.search(r"-s(\d+)$", run_dir.name)
    return int(match.group(1)) if match else None


def load_run(run_dir: Path, label: str | None = None) -> dict:
    """One run for comparison: {"run", "method" (`label` when given, else the eval label when it has
    one, e.g. a fine-tuned RoPE extension), "seed", "train_len", "step", "finished", "windows" (what
    fixes its windows), "nll" {length: window NLLs}, "delta_p_tokens"}."""
    run_dir = Path(run_dir)
    path = run_dir / "eval.json"
    try:
        result = json.loads(path.read_text())
    except FileNotFoundError:
        raise CompareError(f"{run_dir} has no eval.json; evaluate it with `lenx eval {run_dir}`") from None
    except (OSError, ValueError) as e:
        raise CompareError(f"{path} is not readable JSON ({e}); evaluate it again with `lenx eval {run_dir}`") from None
    rows = result.get("results") if isinstance(result, dict) else None
    if not isinstance(rows, dict) or not rows:
        raise CompareError(f"{path} holds no perplexity results; evaluate it with `lenx eval {run_dir}`")
    documents = result.get("window_documents")
    if not isinstance(documents, list) or any(not isinstance(r, dict) or "window_nll" not in r for r in rows.values()):
        raise CompareError(f"{path} has no per-window NLLs (written by an older lenx eval); re-run "
                           f"`lenx eval {run_dir}` to write them")
    nll = {int(L): np.asarray(r["window_nll"], dtype=np.float64) for L, r in rows.items()}
    if any(v.shape != (len(documents),) for v in nll.values()):
        raise CompareError(f"{path} has window NLLs that do not match its {len(documents)} window documents; "
                           f"re-run `lenx eval {run_dir}`")
    bad = [str(L) for L, v in nll.items() if not np.isfinite(v).all()]
    if bad:
        raise CompareError(f"{path} has NaN or infinite window NLLs at length {', '.join(bad)}; re-run "
                           f"`lenx eval {run_dir}`")
    lengths = sorted(nll)
    windows = {key: result.get(key) for key in WINDOW_KEYS} | {"lengths": lengths}
    # ΔP's two terms per window (eval.json from lenx eval since the 125M runs' second seeds)
    inside = result.get("in_distribution")
    short = _window_array(inside.get("window_nll"), len(documents)) if isinstance(inside, dict) else None
    tails = {int(L): _window_array(r.get("delta_p_window_nll"), len(documents)) for L, r in rows.items()
             if "delta_p_window_nll" in r}
    if short is None or any(v is None for v in tails.values()):
        short, tails = None, {}
    elif not all(np.isfinite(v).all() for v in [short, *tails.values()]):
        raise CompareError(f"{path} has NaN or infinite ΔP terms per window; re-run `lenx eval {run_dir}`")
    fingerprint = result.get("corpus_fingerprint")
    try:
        vocab = json.loads((run_dir / "meta.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        vocab = None  # a run folder without meta.json: no ln(vocabulary) check
    return {"run": str(run_dir), "vocab_size": vocab if isinstance(vocab, int) and vocab > 1 else None,
            "method": label or result.get("label") or result.get("method"), "seed": _training_seed(run_dir),
            "corpus_fingerprint": fingerprint if isinstance(fingerprint, dict) else None,
            "train_len": result.get("train_len"), "step": result.get("step"), "finished": result.get("finished"),
            "windows": windows, "nll": {L: nll[L] for L in lengths}, "delta_p_tokens": result.get("delta_p_tokens"),
            "short": short, "tails": tails, "tokenizer": tokenizer_of(result), "sizes": _window_sizes(result, len(documents)),
            "hf": result.get("kind") == "hf", "labelled": label is not None, "per_position": result.get("per_position")}


def tokenizer_of(result: dict) -> str:
    """Which tokenizer an evaluation's tokens are of: "corpus" (lenx's runs, and an HF model whose
    tokenizer is the corpus's), else the HF tokenizer's class and hash."""
    tok = result.get("tokenizer")
    if not isinstance(tok, dict) or tok.get("same_as_corpus"):
        return "corpus"
    return f"{tok.get('class', 'tokenizer')} {str(tok.get('sha256', ''))[:8]}"


def _window_sizes(result: dict, windows: int) -> dict | None:
    """Per window, the tokens and the bytes of the scored tokens and of ΔP's ({"scored": (tokens,
    bytes), "delta_p": (tokens, bytes) or None}), or None when eval.json has no byte counts (an older
    lenx eval, or a token-level corpus). lenx's own evaluations score the same number of tokens in
    every window (scored, delta_p_tokens), so they record bytes only."""
    sizes, counts = result.get("window_bytes"), result.get("window_tokens") or {}
    if not isinstance(sizes, dict):
        return None
    out = {}
    for part, default in (("scored", result.get("scored")), ("delta_p", result.get("delta_p_tokens"))):
        size = _window_array(sizes.get(part), windows)
        tokens = counts.get(part, [default] * windows if isinstance(default, int) else None)
        tokens = _window_array(tokens, windows)
        out[part] = None if size is None or tokens is None else (tokens, np.maximum(size, 1))
    return out if out["scored"] is not None else None


def _per_byte(run: dict) -> dict:
    """A loaded run with its window values in bits per byte instead of NLL per token: each window's
    scored NLL (mean per token x its tokens) over the bytes those tokens cover, / ln 2; ΔP's terms
    likewise where eval.json kept their bytes."""
    if run["sizes"] is None:
        raise CompareError(f"{run['run']}/eval.json records no bytes per window (an older lenx eval); evaluate it "
                           f"again with `lenx eval {run['run']}` to compare it per byte with models of other tokenizers")
    tokens, size = run["sizes"]["scored"]
    bits = {L: v * tokens / size / np.log(2) for L, v in run["nll"].items()}
    short, tails = None, {}
    if run["sizes"]["delta_p"] is not None and run["short"] is not None:
        tokens, size = run["sizes"]["delta_p"]
        short = run["short"] * tokens / size / np.log(2)
        tails = {L: v * tokens / size / np.log(2) for L, v in run["tails"].items()}
    return run | {"nll": bits, "short": short, "tails": tails, "vocab_size": None}


def _window_array(values, windows: int) -> np.ndarray | None:
    """A list of per-window NLLs as an array, or None when it is not one per window."""
    if not isinstance(values, list) or len(values) != windows:
        return None
    return np.asarray(values, dtype=np.float64)


def _check_same_windows(runs: list[dict]) -> None:
    """Every run must be evaluated on the first one's windows; the error names the runs that are not."""
    # the same corpus name prepared anew is another corpus (so are its windows): said first, by name;
    # an eval.json from before fingerprints says nothing
    first = runs[0]
    pinned = [run for run in runs if run["corpus_fingerprint"] is not None]
    other = [run["run"] for run in pinned[1:] if run["corpus_fingerprint"] != pinned[0]["corpus_fingerprint"]]
    if other:
        raise CompareError(f"runs evaluated on another version of corpus {first['windows']['corpus']!r} than "
                           f"{pinned[0]['run']}: {', '.join(other)} (their eval.json records other corpus "
                           "fingerprints); it was prepared anew in between: compare runs evaluated on the same corpus")
    differ = {}
    for run in runs[1:]:
        keys = [key for key in WINDOW_KEYS if run["windows"][key] != first["windows"][key]]
        if keys:
            differ[run["run"]] = keys
    if differ:
        listed = "; ".join(f"{run} ({', '.join(keys)})" for run, keys in differ.items())
        raise CompareError(f"runs evaluated on other windows than {first['run']}: {listed}; evaluate every run "
                           "with the same corpus, split, eval.seed, windows, scored tokens and lengths")


def _hf_apart(runs: list[dict]) -> list[dict]:
    """`lenx eval --hf` results kept apart from training seeds: one named like a run's method, or like
    another such result (an export named after its method, e.g. exp/rope), is the method
    "<name> (hf: <its folder>)", never one more seed of it."""
    names = [run["method"] for run in runs]
    taken = {name for name, run in zip(names, runs) if not run["hf"]}
    return [run | {"method": f"{run['method']} (hf: {run['run']})"}
            if run["hf"] and run["labelled"] is False and (run["method"] in taken or names.count(run["method"]) > 1)
            else run for run in runs]


def _group(runs: list[dict]) -> dict[str, list[dict]]:
    """Runs by method, in order of first appearance; a method's runs must differ in their seed and
    share their training length."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        if not run["method"]:
            raise CompareError(f"{run['run']}/eval.json names no method; re-run `lenx eval {run['run']}`")
        groups.setdefault(run["method"], []).append(run)
    for method, members in groups.items():
        seen = {}
        for run in members:
            if run["seed"] is not None and run["seed"] in seen:
                raise CompareError(f"{seen[run['seed']]} and {run['run']} are both {method} with training seed "
                                   f"{run['seed']}: compare them separately, not as two seeds of one method")
            seen[run["seed"]] = run["run"]
        train_lens = sorted({str(run["train_len"]) for run in members})
        if len(train_lens) > 1:
            raise CompareError(f"the {method} runs were trained at different lengths ({', '.join(train_lens)}): "
                               f"{', '.join(run['run'] for run in members)}")
    return groups


def _delta_p_windows(members: list[dict], lengths: list[int]) -> tuple[np.ndarray, dict, list] | None:
    """ΔP's two terms, [seeds, windows] each, from the runs whose eval.json keeps them per window
    (an older eval.json does not): (the last delta_p_tokens read with T_train tokens of input,
    {L: the same tokens read at L}, those runs' seeds); None when no run keeps them."""
    T = members[0]["train_len"]
    longer = [L for L in lengths if isinstance(T, int) and L > T]
    kept = [r for r in members if r["short"] is not None and sorted(r["tails"]) == longer]
    if not kept:
        return None
    return (np.stack([r["short"] for r in kept]), {L: np.stack([r["tails"][L] for r in kept]) for L in longer},
            [r["seed"] for r in kept])


def _interval_entry(window_nll: np.ndarray, documents: np.ndarray, boot: dict, unit: str = "ppl") -> dict:
    """The seed-mean perplexity (unit "bpb": bits per byte) with its interval over documents and seeds."""
    bpb = unit == "bpb"
    interval = method_interval(window_nll, documents, scale="nll" if bpb else "ppl", **boot)
    return {"bpb" if bpb else "ppl": interval["value"], "lo": interval["lo"], "hi": interval["hi"],
            "per_seed": interval["per_seed"], "covers": interval["covers"],
            "median_bpb" if bpb else "median_nll": float(np.median(window_nll))}


def _difference(a: np.ndarray, b: np.ndarray, documents: np.ndarray, boot: dict, scale: str = "ppl") -> dict:
    """Method a minus the reference b ([seeds, windows] each): the seed-mean perplexity difference with
    its interval over seeds and documents (stats.method_difference; "covers": "documents only" when
    either has one seed), each one's seed-to-seed spread, the share of documents on which a is
    better, the three documents with the largest share of the mean-NLL difference, and the documents
    whose removal alone changes the verdict."""
    d = method_difference(a, b, documents, scale=scale, **boot)
    loo = leave_one_document_out(a, b, documents, scale=scale, **boot)
    words = {"a lower": "lower than the reference", "b lower": "higher than the reference",
             "no difference": "no difference"}
    # an interval that measured no spread ("nothing": one seed, one document) excludes nothing
    excludes = bool(d["lo"] > 0 or d["hi"] < 0) and d["covers"] != "nothing"
    return {"diff": d["diff"], "lo": d["lo"], "hi": d["hi"], "excludes_zero": excludes,
            "covers": d["covers"], "seed_sd": d["seed_sd_a"], "reference_seed_sd": d["seed_sd_b"],
            "document_win_rate": document_win_rate(a, b, documents), "top_documents": document_shares(a, b, documents)[:3],
            "verdict": words[loo["verdict"]], "decided_by": [f | {"verdict": words[f["verdict"]]} for f in loo["flips"]]}


def _checked_options(n, seed, level) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < MIN_RESAMPLES:
        raise CompareError(f"resamples must be an integer >= {MIN_RESAMPLES}, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise CompareError(f"the bootstrap seed must be an integer >= 0, got {seed!r}")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise CompareError(f"level must be a number between 0 and 1, got {level!r}")


def compare_runs(run_dirs: list[Path], reference: str | None = None, n: int = 2000, seed: int = 0,
                 level: float = 0.95, labels: list[str | None] | None = None) -> dict:
    """Seed-mean perplexity of every method at every length with its interval over documents (n
    bootstrap resamples, drawn by `seed`, the same draw for every method and length) and seeds, ΔP
    likewise where the window NLLs allow it, and with `reference` (a method name) each other
    method's paired difference to it over seeds and documents (_difference). `labels`: one method name
    per run (None: its eval.json's), for runs that one method's name does not tell apart (a DAPE of
    another hidden width). All of it JSON-ready; see the module docstring. A CompareError
    (one line) when the runs cannot be compared: no per-window NLLs, other windows, a seed twice, an
    unknown reference."""
    _checked_options(n, seed, level)
    if not run_dirs:
        raise CompareError("no run to compare")
    if labels is not None and len(labels) != len(run_dirs):
        raise CompareError(f"{len(labels)} labels for {len(run_dirs)} runs")
    runs = [load_run(Path(r), label) for r, label in zip(run_dirs, labels or [None] * len(run_dirs))]
    _check_same_windows(runs)
    runs = _hf_apart(runs)
    tokenizers = sorted({run["tokenizer"] for run in runs})
    # NLL per token of different tokenizers measures different units: compared per byte of the same text
    unit = "bpb" if len(tokenizers) > 1 else "ppl"
    if unit == "bpb":
        runs = [_per_byte(run) for run in runs]
    scale = "nll" if unit == "bpb" else "ppl"
    groups = _group(runs)
    if reference is not None and reference not in groups:
        raise CompareError(f"reference method {reference!r} is not among the compared methods "
                           f"({', '.join(groups)})")
    windows = runs[0]["windows"]
    documents = np.asarray(windows["window_documents"])
    distinct = int(len(np.unique(documents)))
    lengths = windows["lengths"]
    boot = {"n": n, "seed": seed, "level": level}

    stacked = {method: {L: np.stack([r["nll"][L] for r in members]) for L in lengths}
               for method, members in groups.items()}
    methods, inside = {}, {}
    for method, members in groups.items():
        T = members[0]["train_len"]
        terms = _delta_p_windows(members, lengths)
        note = None if terms is not None else NO_DELTA_P
        per_length = {}
        vocab = members[0]["vocab_size"]
        for L in lengths:
            entry = _interval_entry(stacked[method][L], documents, boot, unit) | {"seeds": len(members),
                                                                                   "documents": distinct}
            if vocab:  # windows whose mean NLL is above uniform guessing's: text the model cannot read
                summary = window_summary(stacked[method][L], documents, vocab)
                entry["above_uniform_windows"] = summary["above_uniform_windows"]
                entry["above_uniform_documents"] = summary["above_uniform_documents"]
            if terms is not None and L > T:
                # per seed: exp(mean NLL read with T_train tokens) - exp(mean NLL of the same tokens at L)
                short, tail = terms[0], terms[1][L]
                dp = same_seeds_difference(short, tail, documents, scale=scale, **boot)
                per_seed = short.mean(1) - tail.mean(1) if unit == "bpb" else np.exp(short.mean(1)) - np.exp(tail.mean(1))
                entry["delta_p"] = {"value": dp["diff"], "lo": dp["lo"], "hi": dp["hi"], "per_seed": per_seed.tolist(),
                                    "covers": dp["covers"]}
            per_length[str(L)] = entry
        methods[method] = {"runs": [r["run"] for r in members], "seeds": [r["seed"] for r in members],
                           "train_len": T, "delta_p_note": note, "lengths": per_length}
        methods[method]["effective_length"] = perplexity_effective(stacked[method], members, terms, documents, boot,
                                                                   unit)
        if terms is not None:
            methods[method]["delta_p_seeds"] = terms[2]  # the seeds ΔP is measured on
            methods[method]["in_distribution"] = _interval_entry(terms[0], documents, boot, unit) | {
                "length": T, "tokens": members[0]["delta_p_tokens"], "seeds": terms[2]}
            inside[method] = terms[0]

    differences = {}
    if reference is not None:
        for method in groups:
            if method == reference:
                continue
            differences[method] = {}
            for L in lengths:
                differences[method][str(L)] = _difference(stacked[method][L], stacked[reference][L], documents, boot,
                                                          scale)
            if "in_distribution" in methods[method] and "in_distribution" in methods[reference]:
                # seed means over the seeds that kept the point (they may be fewer than the method's)
                differences[method]["in_distribution"] = _difference(inside[method], inside[reference], documents, boot,
                                                                     scale)

    curves = method_curves(groups, len(documents), documents, boot, CompareError)  # where eval.json has them
    suite = suite_effective(groups, level)  # each method's effective length on the suite files its runs have
    return {"written_by": WRITTEN_BY, "unit": unit, "tokenizers": tokenizers, "level": level, "resamples": n,
            "seed": seed, "reference": reference,
            "corpus": windows["corpus"], "split": windows["split"], "eval_seed": windows["eval_seed"],
            "scored": windows["scored"], "lengths": lengths, "windows": int(len(documents)), "documents": distinct,
            "runs": [{"run": r["run"], "method": r["method"], "seed": r["seed"], "step": r["step"],
                      "finished": r["finished"], "tokenizer": r["tokenizer"]} for r in runs],
            "methods": methods, "differences": differences, "effective_length_rule": RULE,
            **({"per_position": curves} if curves else {}), **({"suite": suite} if suite else {})}


def compare_to_file(paths: list[Path], out: Path, named: bool, force: bool, reference: str | None = None,
                    n: int = 2000, seed: int = 0, show=None) -> dict:
    """compare_runs over the runs that `paths` name (find_runs), written to `out` as JSON; whether
    `out` may be written (check_out: `named` by the user, `force`) is checked before any work.
    show(result) hears the result before it is written, or before an earlier comparison in `out`
    refuses to be replaced (a CompareError then: the table is still seen, the old file kept)."""
    refusal = check_out(out, named, force)
    result = compare_runs(find_runs(paths), reference, n=n, seed=seed)
    if show is not None:
        show(result)
    if refusal:
        raise CompareError(refusal)
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json(out, result)
    except OSError as e:  # e.g. a folder that only root's permission check let through (chattr +i)
        denied = e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        why = f"{out.parent} is not writable (permission denied)" if denied else (e.strerror or str(e))
        raise CompareError(f"cannot write --out {out}: {why}") from None
    return result
