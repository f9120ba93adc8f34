"""The claims table of issue 29: each claim of the DAPE V2 and stick-breaking papers (results/epoch/
claims.toml) against what the single-epoch runs of results/epoch measured, with a verdict.

    python scripts/repro/claims_epoch.py                 # --results results/epoch --resamples 2000
    python scripts/repro/claims_epoch.py --plan verdict2 # --results results/verdict2 --baselines results/recipe

writes <results>/claims.md (a table for people) and <results>/claims.json, and the one-line summary of
each claim into the REPORT.md beside <results> (between its markers, where it has them).
collect_epoch.py runs it at its end, so one command updates the tables, the claims and the summary.
claims_md.py holds the text (the rule, the tables, the summary); stability.py the rule that a verdict
must not change with the bootstrap's random seed; claims_plans.py the plans a claims.toml is checked
against: `epoch` (plan.py's epoch plan, the runs of <results>/runs/T<T>) or `verdict2` (plan.py's
verdict2 plan under <results>: the newer methods and the five trained with the same recipe, the
recipe plan's runs it reuses read from --baselines; its methods are the run names without the seed:
kerple, fox, rnope-swa, kerple-docmasked, ...).

Each claim's test compares window NLLs on the same 64 test windows (claims.toml says how): method a
against method b at each length (b trained at another length with b_train_len: the same tokens spent
at another training length; the scored windows are the same), or one method at each length against
itself at b_length, or ΔP's two terms of one method, or method a's ΔP against method b's. The figure is the seed-mean perplexity
difference (or ΔP, or the difference of two ΔP), or with scale "ratio" exp of the difference of
seed-mean NLLs, and its 95% interval covers the documents (paired: one resample for every side) and
the seeds (lenx.report.stats): method_difference for two methods, same_seeds_difference where both
sides are the same seeds' models (a method against its own other length, ΔP's two terms: the spread
of each seed's own difference), delta_p_difference for two methods' ΔP. Where a method has one seed
the interval covers documents only, and the table says so.
"""

import argparse
import json
import os
from pathlib import Path
import re
import sys
import tomllib

import numpy as np

from collect import load_run as load_finished
from claims_md import RULE, STABILITY, markdown, sync_report, tally
from claims_plans import PLANS, checked_groups, epoch_plan, load_planned, verdict2_plan
from stability import stable

from lenx.report.compare import MIN_RESAMPLES, WINDOW_KEYS, CompareError, load_run
from lenx.report.stats import delta_p_difference, method_difference, same_seeds_difference

WRITTEN_BY = "scripts/repro/claims_epoch.py"
LEVEL = 0.95
METRICS = {"ppl": "perplexity of the last 256 tokens", "in_distribution": "in-distribution perplexity",
           "delta_p": "ΔP"}
REQUIRED = ("id", "paper", "claim", "evidence", "train_len", "metric", "a", "direction")
OPTIONAL = ("b", "b_length", "b_train_len", "scale", "threshold", "lengths", "note")
UNTESTED = ("id", "paper", "claim", "evidence", "why", "report")
EVERY = re.compile(r"every length >= (\d+)T")
class ClaimsError(ValueError):
    """A claims.toml that cannot be read or checked; the message is one line for the user."""


def planned(which: str = "epoch", results: Path | None = None, baselines: Path | None = None) -> dict[int, dict]:
    """train_len -> {"lengths": the evaluated lengths, "runs": {label: [planned run names]}, ...} of
    plan.py's epoch or verdict2 plan (claims_plans.py; verdict2 needs the results and baselines trees)."""
    return epoch_plan() if which == "epoch" else verdict2_plan(results, baselines)


def resolve_lengths(claim: dict, lengths: list[int]) -> list[int] | None:
    """The lengths a claim is tested at (None for in_distribution)."""
    if claim["metric"] == "in_distribution":
        return None
    spec = claim.get("lengths")
    if isinstance(spec, str) and EVERY.fullmatch(spec):
        return [L for L in lengths if L >= int(EVERY.fullmatch(spec).group(1)) * claim["train_len"]]
    return list(spec)


def check_claim(claim, plan: dict, seen: set, which: str = "epoch") -> dict:
    """A claim with its defaults filled in, or a ClaimsError naming it and what is wrong (`which`: the
    plan's name, for the message)."""
    if not isinstance(claim, dict):
        raise ClaimsError("a [[claim]] must be a table of keys")
    name = claim.get("id")
    where = f"claim {name!r}" if isinstance(name, str) else "a claim"

    def bad(message):
        raise ClaimsError(f"{where}: {message}")

    missing = [k for k in REQUIRED if k not in claim]
    if missing:
        bad(f"missing {', '.join(missing)}")
    unknown = sorted(set(claim) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        bad(f"unknown key {', '.join(unknown)} (keys: {', '.join(REQUIRED + OPTIONAL)})")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        bad("id must be a plain name (letters, digits, . _ -)")
    if name in seen:
        bad("id used twice")
    for key in ("paper", "claim", "evidence", "note"):
        if key in claim and not (isinstance(claim[key], str) and claim[key].strip()):
            bad(f"{key} must be a non-empty string")
    T = claim["train_len"]
    if T not in plan or isinstance(T, bool):
        bad(f"train_len must be one of the {which} plan's {', '.join(map(str, sorted(plan)))}, got {T!r}")
    if claim["metric"] not in METRICS:
        bad(f"metric must be one of {', '.join(METRICS)}, got {claim['metric']!r}")
    if claim["direction"] not in ("below", "above"):
        bad(f"direction must be below or above, got {claim['direction']!r}")
    c = {"scale": "difference", "b": None, "b_length": None, "note": None} | claim
    if c["scale"] not in ("difference", "ratio"):
        bad(f"scale must be difference or ratio, got {c['scale']!r}")
    c.setdefault("threshold", 1.0 if c["scale"] == "ratio" else 0.0)
    if isinstance(c["threshold"], bool) or not isinstance(c["threshold"], (int, float)):
        bad(f"threshold must be a number, got {c['threshold']!r}")
    if c["scale"] == "ratio" and c["threshold"] <= 0:
        bad(f"a ratio's threshold must be above 0, got {c['threshold']}")
    runs, lengths = plan[T]["runs"], plan[T]["lengths"]
    Tb = c.get("b_train_len", T)
    if Tb not in plan or isinstance(Tb, bool):
        bad(f"b_train_len must be one of the {which} plan's {', '.join(map(str, sorted(plan)))}, got {Tb!r}")
    if Tb != T and (c["metric"] != "ppl" or c["b"] is None or c["b_length"] is not None):
        bad("b_train_len compares perplexity with another method trained at another length: metric ppl, b, "
            "no b_length")
    for side, at in (("a", T), ("b", Tb)):
        if c[side] is not None and c[side] not in plan[at]["runs"]:
            bad(f"{side} = {c[side]!r} is not a method of the {which} plan at T {at} ({', '.join(plan[at]['runs'])})")
    if c["metric"] == "delta_p" and (c["b_length"] is not None or c["scale"] != "difference" or c["b"] == c["a"]):
        bad("delta_p is one method's ΔP, or with b another method's ΔP subtracted: no b_length, ratio or b = a")
    if c["metric"] == "in_distribution":
        if "lengths" in c or c["b_length"] is not None:
            bad("in_distribution is measured at the training length: no lengths or b_length")
        if c["b"] is None:
            bad("in_distribution needs b, the method to compare with")
    elif "lengths" not in c:
        bad("lengths is missing (a list of lengths, or \"every length >= 2T\")")
    if c["metric"] == "ppl" and c["b"] is None and c["b_length"] is None:
        bad("ppl needs b (another method) or b_length (the same method at another length)")
    spec = c.get("lengths")
    if isinstance(spec, str):
        if not EVERY.fullmatch(spec):
            bad(f"lengths must be a list of lengths or \"every length >= 2T\", got {spec!r}")
    elif spec is not None:
        if not isinstance(spec, list) or not spec or any(isinstance(L, bool) or not isinstance(L, int) for L in spec):
            bad(f"lengths must be a list of lengths or \"every length >= 2T\", got {spec!r}")
        if len(set(spec)) != len(spec):
            bad("a length is listed twice")
    wanted = (resolve_lengths(c, lengths) or []) + ([c["b_length"]] if c["b_length"] is not None else [])
    for at in sorted({T, Tb}):
        odd = [str(L) for L in wanted if L not in plan[at]["lengths"]]
        if odd:
            bad(f"length {', '.join(odd)} is not evaluated at T {at} (lengths: "
                f"{', '.join(map(str, plan[at]['lengths']))})")
    if c["metric"] != "in_distribution" and not resolve_lengths(c, lengths):
        bad(f"no evaluated length matches {spec!r} at T {T}")
    if c["metric"] == "delta_p" and min(resolve_lengths(c, lengths)) <= T:
        bad(f"ΔP is measured beyond the training length only (above {T})")
    seen.add(name)
    return c


def load_claims(path: Path, plan: dict | None = None, which: str = "epoch") -> tuple[list[dict], list[dict]]:
    """claims.toml's claims (checked against `plan`, named `which`; by default the epoch plan) and its
    untested entries."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ClaimsError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ClaimsError(f"{path}: not readable TOML ({e})") from None
    odd = sorted(set(data) - {"claim", "untested"})
    if odd:
        raise ClaimsError(f"{path}: unknown table {', '.join(odd)} (it holds [[claim]] and [[untested]] entries)")
    if not isinstance(data.get("claim"), list) or not data["claim"]:
        raise ClaimsError(f"{path}: no [[claim]] entry")
    plan, seen = plan or planned(), set()
    try:
        claims = [check_claim(c, plan, seen, which) for c in data["claim"]]
        untested = data.get("untested", [])
        for u in untested:
            if not isinstance(u, dict) or sorted(u) != sorted(UNTESTED):
                raise ClaimsError(f"untested {u.get('id') if isinstance(u, dict) else u!r}: needs exactly the keys "
                                  f"{', '.join(UNTESTED)}")
            if u["id"] in seen:
                raise ClaimsError(f"untested {u['id']!r}: id used twice")
            seen.add(u["id"])
    except ClaimsError as e:
        raise ClaimsError(f"{path}: {e}") from None
    return claims, untested


def load_length(results: Path, T: int) -> dict:
    """{label: [compare.load_run of each finished run, seed order]} of results/runs/T<T>; a CompareError
    when two runs were evaluated on other windows, or one method has a seed twice."""
    groups = {}
    for run in sorted((results / "runs" / f"T{T}").glob("*")):
        r = load_finished(run) if (run / "config.toml").is_file() else None
        if r is not None and r["results"]:
            groups.setdefault(r["label"], []).append(load_run(run, r["label"]))
    return checked_groups(groups, T)


def sides(c: dict, by_T: dict, L: int | None) -> tuple[np.ndarray, ...] | None:
    """The [seeds, windows] NLLs that one length's figure is computed from: (a, b), or for ΔP (a's
    short, a's tail[, b's short, b's tail]); None when ΔP's terms were not kept. by_T: training length
    -> {label: runs}."""
    a = by_T[c["train_len"]][c["a"]]
    b = by_T[c.get("b_train_len", c["train_len"])][c["b"] or c["a"]]
    if c["metric"] == "in_distribution":
        kept = all(r["short"] is not None for r in a + b)
        return (np.stack([r["short"] for r in a]), np.stack([r["short"] for r in b])) if kept else None
    if c["metric"] == "delta_p":
        both = a + (b if c["b"] else [])
        if not all(r["short"] is not None and L in r["tails"] for r in both):
            return None
        # ΔP = P(the last T tokens read alone) - P(the same tokens read at L)
        terms = [np.stack([r["short"] for r in a]), np.stack([r["tails"][L] for r in a])]
        if c["b"]:
            terms += [np.stack([r["short"] for r in b]), np.stack([r["tails"][L] for r in b])]
        return tuple(terms)
    return np.stack([r["nll"][L] for r in a]), np.stack([r["nll"][c["b_length"] or L] for r in b])


def interval(c: dict, terms: tuple, documents, n: int, seed: int) -> dict:
    """The figure and its interval: two methods' ΔP, or the same seeds measured twice (ΔP, a method at
    its own other length), or two methods."""
    scale = "nll" if c["scale"] == "ratio" else "ppl"
    if len(terms) == 4:
        return delta_p_difference(*terms, documents, n=n, seed=seed, level=LEVEL, scale=scale)
    same_models = c["b"] in (None, c["a"]) and c.get("b_train_len", c["train_len"]) == c["train_len"]
    if c["metric"] == "delta_p" or (c["metric"] == "ppl" and same_models):
        return same_seeds_difference(*terms, documents, n=n, seed=seed, level=LEVEL, scale=scale)
    return method_difference(*terms, documents, n=n, seed=seed, level=LEVEL, scale=scale)


def verdict_of(lo: float, hi: float, boundary: float, direction: str) -> str:
    below = hi < boundary
    above = lo > boundary
    if not below and not above:
        return "inconclusive"
    return "confirmed" if (below if direction == "below" else above) else "contradicted"


def evaluate_claim(c: dict, by_T: dict, plan: dict, n: int, seed: int) -> dict:
    """One claim's figures per length, its verdict, and the runs it rests on or misses. by_T: training
    length -> {label: runs}."""
    T, Tb = c["train_len"], c.get("b_train_len", c["train_len"])
    compared = [(c["a"], T)] + ([(c["b"], Tb)] if c["b"] and (c["b"], Tb) != (c["a"], T) else [])
    names = {(m, at): m if at == T else f"{m} at T {at}" for m, at in compared}
    out = {key: c[key] for key in REQUIRED + OPTIONAL if key in c} | {"test": describe(c)}
    out["runs"] = {names[m, at]: [Path(r["run"]).name for r in by_T[at].get(m, [])] for m, at in compared}
    out["planned"] = {names[m, at]: plan[at]["runs"][m] for m, at in compared}
    missing = [(m, at) for m, at in compared if not by_T[at].get(m)]
    if missing:
        absent = [plan[at].get("shown", {}).get((m, name), f"runs/T{at}/{name}") for m, at in missing
                  for name in plan[at]["runs"][m]]
        return out | {"verdict": "not tested", "missing": absent, "figures": []}
    first, other = by_T[T][c["a"]][0], by_T[Tb][c["b"] or c["a"]][0]
    differ = [key for key in WINDOW_KEYS if key != "lengths" and first["windows"][key] != other["windows"][key]]
    if differ:  # another training length: the scored windows must still be the same
        raise CompareError(f"claim {c['id']!r}: {other['run']} was evaluated on other windows than {first['run']} "
                           f"({', '.join(differ)})")
    lengths = resolve_lengths(c, plan[T]["lengths"]) or [None]
    documents = np.asarray(first["windows"]["window_documents"])
    terms = {L: sides(c, by_T, L) for L in lengths}
    if any(t is None for t in terms.values()):
        return out | {"verdict": "not tested", "missing": [], "figures": [],
                      "why": "an eval.json keeps no ΔP terms per window (an older lenx eval)"}

    def measure(resamples: int, boot_seed: int) -> tuple[list, str]:
        figures = []
        for L in lengths:
            d = interval(c, terms[L], documents, resamples, boot_seed)
            value, lo, hi = (np.exp([d["diff"], d["lo"], d["hi"]]) if c["scale"] == "ratio"
                             else (d["diff"], d["lo"], d["hi"]))
            figures.append({"length": L, "value": float(value), "lo": float(lo), "hi": float(hi),
                            "covers": d["covers"], "verdict": verdict_of(lo, hi, c["threshold"], c["direction"])})
        found = {f["verdict"] for f in figures}
        return figures, ("contradicted" if "contradicted" in found else "confirmed" if found == {"confirmed"}
                         else "inconclusive")

    figures, verdict, check = stable(measure, n, seed)
    return out | {"verdict": verdict, "missing": [], "figures": figures, "stability": check,
                  "documents": int(len(np.unique(documents))),
                  "covers": "documents only" if any(f["covers"] == "documents only" for f in figures)
                  else "seeds and documents"}


def describe(c: dict) -> str:
    """The test in words: `ppl(dapev2-kerple) - ppl(kerple) < 0 at 8192, 16384`."""
    metric = {"ppl": "ppl", "in_distribution": "in-distribution ppl", "delta_p": "ΔP"}[c["metric"]]
    at_b = f" at {c['b_length']}" if c["b_length"] else ""
    if c["metric"] == "delta_p":
        left = f"ΔP({c['a']})" + (f" - ΔP({c['b']})" if c["b"] else "")
    else:
        op = " / " if c["scale"] == "ratio" else " - "
        Tb = c.get("b_train_len", c["train_len"])
        trained = f" trained at {Tb}" if Tb != c["train_len"] else ""
        left = f"{metric}({c['a']}){op}{metric}({c['b'] or c['a']}{trained}{at_b})"
    threshold = f"{c['threshold']:g}"
    where = "" if c["metric"] == "in_distribution" else " at " + (
        c["lengths"] if isinstance(c["lengths"], str) else ", ".join(map(str, c["lengths"])))
    return f"{left} {'<' if c['direction'] == 'below' else '>'} {threshold}{where} (T {c['train_len']})"


def write_claims(results: Path, claims_path: Path, n: int = 2000, seed: int = 0,
                 checked: tuple[list, list] | None = None, which: str = "epoch", baselines: Path | None = None) -> dict:
    """claims.json and claims.md under `results` from claims.toml (`checked`: load_claims' result,
    when the caller checked it before its own work) against plan `which` (verdict2: with the recipe
    tree `baselines`, where its reused runs are), and the summary in the REPORT.md beside `results`
    where it has the markers."""
    baselines = baselines or results.parent / "recipe"
    plan = planned(which, results, baselines)
    claims, untested = checked or load_claims(claims_path, plan, which)
    lengths = {c["train_len"] for c in claims} | {c.get("b_train_len", c["train_len"]) for c in claims}
    by_T = {T: load_planned(plan[T], T) if "folders" in plan[T] else load_length(results, T) for T in sorted(lengths)}
    report = {"written_by": WRITTEN_BY, "rule": RULE, "stability_rule": STABILITY, "level": LEVEL, "resamples": n, "seed": seed,
              "claims": [evaluate_claim(c, by_T, plan, n, seed) for c in claims], "untested": untested}
    if which != "epoch":  # results/epoch's claims.json keeps the keys it always had
        report |= {"plan": which, "baselines": os.path.relpath(baselines, results)}
    (results / "claims.json").write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    (results / "claims.md").write_text(markdown(report) + "\n")
    if sync_report(results.parent / "REPORT.md", report):
        print(f"updated the claims summary in {results.parent / 'REPORT.md'}")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", choices=PLANS, default="epoch",
                   help="the plan the claims are checked against: epoch (default) or verdict2 (with the "
                        "recipe runs it reuses from --baselines)")
    p.add_argument("--results", type=Path, default=None, help="the results tree (runs/<T>/<run>; default: results/PLAN)")
    p.add_argument("--baselines", type=Path, default=None,
                   help="--plan verdict2: the recipe results tree its reused runs come from (default: RESULTS/../recipe)")
    p.add_argument("--claims", type=Path, default=None, help="the claims (default: RESULTS/claims.toml)")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples of the documents")
    args = p.parse_args(argv)
    args.results = args.results or Path("results") / args.plan
    if not args.results.is_dir():
        print(f"error: --results {args.results} is not a folder", file=sys.stderr)
        return 2
    if args.baselines is not None and args.plan != "verdict2":
        print("error: --baselines goes with --plan verdict2", file=sys.stderr)
        return 2
    if args.plan == "verdict2":
        args.baselines = args.baselines or args.results.parent / "recipe"
        if not args.baselines.is_dir():
            print(f"error: --baselines {args.baselines} is not a folder (the recipe results tree)", file=sys.stderr)
            return 2
    if args.resamples < MIN_RESAMPLES:
        print(f"error: --resamples must be at least {MIN_RESAMPLES}, got {args.resamples}", file=sys.stderr)
        return 2
    try:
        report = write_claims(args.results, args.claims or args.results / "claims.toml", args.resamples,
                              which=args.plan, baselines=args.baselines)
    except (ClaimsError, CompareError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.results / 'claims.md'} ({tally(report)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
