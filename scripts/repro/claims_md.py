"""The claims table's text (claims_epoch.py computes the claims): claims.md for people, the one-line
summary that REPORT.md carries between its markers, and the rule the verdicts follow."""

from pathlib import Path
import re

from stability import MORE, SEEDS, stability_text

from lenx.report.tables import Table, columns, to_markdown

RULE = ("confirmed: the 95% interval lies on the claimed side of the boundary at every length tested; "
        "contradicted: it lies on the other side at some length; inconclusive: otherwise (it covers the "
        "boundary); not tested: a run it needs is missing. Intervals cover the test documents and each "
        "method's training seeds; \"documents only\" marks a figure where a side has one seed (its seed-to-seed "
        "spread is unknown, so the interval is too narrow for a claim about the method). Coverage: in a simulation "
        "of this setting (64 documents, 2 or 3 seeds, a seed spread from none to 8x the documents') the 95% "
        "intervals held the truth 93.5-96.3% of the time (scripts/repro/coverage.py, results/epoch/coverage.json); "
        "they cover this recipe's seeds and this corpus's long test documents, nothing about domain, budget or "
        "model size.")
STABILITY = (f"Each verdict is computed with {SEEDS} bootstrap seeds; where they disagree it is computed again "
             f"with {MORE} times the resamples, and where they still disagree the claim is inconclusive "
             "(borderline, with the share of seeds giving each verdict).")


def number(x: float, ratio: bool) -> str:
    return f"{x:.3f}" if ratio else f"{x:+.2f}" if abs(x) < 100 else f"{x:+.0f}"


def value_text(f: dict, ratio: bool) -> str:
    """A figure with its interval: `-0.42 [-0.60, -0.24]`."""
    return f"{number(f['value'], ratio)} [{number(f['lo'], ratio)}, {number(f['hi'], ratio)}]"


def figure_text(r: dict) -> str:
    if r["verdict"] == "not tested":
        return r.get("why") or "missing: " + ", ".join(r["missing"])
    ratio = r.get("scale") == "ratio"
    return "; ".join(("" if f["length"] is None else f"{f['length']}: ") + value_text(f, ratio) for f in r["figures"])


def seeds_text(r: dict) -> str:
    if r["verdict"] == "not tested":
        return ""
    runs = "; ".join(f"{m}: {len(names)} of {len(r['planned'][m])} seeds" for m, names in r["runs"].items())
    return f"{runs}; {r['documents']} documents" + (" (covers documents only)" if r["covers"] == "documents only" else "")


def deciding_figure(r: dict) -> str:
    """The figure that decides a verdict, in one line: for a confirmed claim the one nearest the boundary
    (the weakest); otherwise the first on the wrong side (contradicted) or across it (inconclusive), with
    the other lengths where that happens."""
    if r["verdict"] == "not tested":
        if r.get("why"):
            return r["why"]
        n, Ts = len(r["missing"]), sorted({int(re.search(r"(?:^|/)T(\d+)/", m).group(1)) for m in r["missing"]})
        return f"waits for {n} run{'s' if n > 1 else ''} at T {', '.join(map(str, Ts))}"
    ratio = r.get("scale") == "ratio"

    def margin(f: dict) -> float:  # > 0: the whole interval on the claimed side
        return r["threshold"] - f["hi"] if r["direction"] == "below" else f["lo"] - r["threshold"]

    figures = r["figures"]
    wrong = [f for f in figures if f["verdict"] == r["verdict"]]
    if r["verdict"] == "confirmed" or not wrong:  # not wrong: borderline, seed 0 on the claimed side
        chosen, others = min(figures, key=margin), []
        lead = "weakest, " if len(figures) > 1 else ""
    else:
        chosen, others, lead = wrong[0], wrong[1:], ""
    at = "in distribution" if chosen["length"] is None else f"at {chosen['length']}"
    text = f"{lead}{at}: {value_text(chosen, ratio)}"
    if others:
        text += f" ({r['verdict']} also at {', '.join(str(f['length']) for f in others)})"
    return text


def stability_note(r: dict) -> str:
    text = stability_text(r["stability"]) if "stability" in r else ""
    return f" ({text})" if text else ""


def summary(report: dict) -> str:
    """Each claim in one row: the claim, its paper, the figure that decides it and the verdict (REPORT.md
    carries this table between SUMMARY_BEGIN and SUMMARY_END)."""
    table = Table("each claim in one line: the figure that decides its verdict, with its 95% interval",
                  columns("claim", "paper", "test", "lenx [95% interval]", "verdict"))
    for r in report["claims"]:
        one_seed = " (one seed)" if r.get("covers") == "documents only" else ""
        table.add_row(f"**{r['id']}**: {r['claim']}", r["paper"], r["test"], deciding_figure(r),
                      f"**{r['verdict']}**{one_seed}{stability_note(r)}")
    return to_markdown(table)


def summary_begin(plan: str = "epoch") -> str:
    """The marker a plan's summary starts after in REPORT.md (each plan has its own)."""
    return f"<!-- claims summary: made by scripts/repro/claims_epoch.py from results/{plan}/claims.json -->"


SUMMARY_BEGIN = summary_begin()
SUMMARY_END = "<!-- end of the claims summary -->"


def sync_report(path: Path, report: dict) -> bool:
    """Write the summary between the markers of `path` (REPORT.md) for the report's plan; False when
    it has none."""
    begin = summary_begin(report.get("plan", "epoch"))
    text = path.read_text() if path.is_file() else ""
    if begin not in text or SUMMARY_END not in text.split(begin, 1)[1]:
        return False
    head, rest = text.split(begin, 1)
    tail = rest.split(SUMMARY_END, 1)[1]
    path.write_text(f"{head}{begin}\n\n{summary(report)}\n{SUMMARY_END}{tail}")
    return True


def tally(report: dict) -> str:
    """"1 confirmed, 31 not tested"."""
    verdicts = [r["verdict"] for r in report["claims"]]
    return ", ".join(f"{verdicts.count(v)} {v}" for v in sorted(set(verdicts)))


def markdown(report: dict) -> str:
    if report.get("plan", "epoch") == "epoch":
        title, made, runs = ("# Claims of the two papers against the single-epoch runs", "from claims.toml and "
                             "runs/<T>/*/eval.json", "the epoch runs")
    else:
        title = f"# Claims of the newer methods' papers against the {report['plan']} runs"
        made = (f"with `--plan {report['plan']}` from claims.toml, runs/<T>/*/eval.json and the epoch runs' "
                f"({report['baselines']}/runs/<T>/*/eval.json)")
        runs = f"the {report['plan']} runs"
    lines = [title, "", f"Made by scripts/repro/claims_epoch.py {made}; the numbers are in claims.json.", "",
             f"Verdicts: {tally(report)}.", "", f"Rule: {RULE} {STABILITY}", "", summary(report), "",
             f"The interval: Student's t over the variance of {report['resamples']} bootstrap resamples of the "
             f"documents (seed {report['seed']}) plus the seeds' (lenx.report.stats: method_difference for two "
             "methods, each side's seed-to-seed variance; same_seeds_difference for a method against its own other "
             "length and for ΔP, the variance of each seed's own difference; delta_p_difference for two methods' "
             "ΔP); a ratio is exp of the difference of seed-mean NLLs.", ""]
    table = Table("each claim, the paper's evidence, lenx's figure at each length with its 95% interval",
                  columns("claim", "paper", "paper's evidence", "test", "lenx [95% interval]", "seeds, documents",
                          "verdict"))
    for r in report["claims"]:
        claim = f"**{r['id']}**: {r['claim']}" + (f" ({r['note']})" if r.get("note") else "")
        one_seed = " (one seed: documents only)" if r.get("covers") == "documents only" else ""
        table.add_row(claim, r["paper"], r["evidence"], r["test"], figure_text(r), seeds_text(r),
                      f"**{r['verdict']}**{one_seed}{stability_note(r)}")
    lines += [to_markdown(table), "", f"## Not tested in {runs}", ""]
    untested = Table(f"claims {runs.replace('runs', 'plan')} cannot test, and where REPORT.md covers them",
                     columns("claim", "paper", "paper's evidence", "why not here", "covered in"))
    for u in report["untested"]:
        untested.add_row(f"**{u['id']}**: {u['claim']}", u["paper"], u["evidence"], u["why"], u["report"])
    lines.append(to_markdown(untested))
    return "\n".join(lines)
