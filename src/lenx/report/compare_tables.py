"""What `lenx compare` prints: seed-mean perplexity [interval] per method and length (bits per
byte, and a line that says why, when the results use different tokenizers), ΔP where it could be
recomputed, the differences to the reference method, the verdicts one document decides,
and the notes between them."""

import statistics

from .tables import Column, Strong, Table


def _interval(value: float, lo: float, hi: float, sign: str = "", digits: int = 2) -> str:
    return f"{value:{sign}.{digits}f} [{lo:{sign}.{digits}f}, {hi:{sign}.{digits}f}]"


def _dagger(entry: dict) -> str:
    """† after an interval that does not cover both seeds and documents (one seed, or one document)."""
    return "†" if entry.get("covers") not in (None, "seeds and documents") else ""


def _ppl(entry: dict) -> str:
    """A perplexity, or bits per byte ("bpb", 3 decimals), with its interval."""
    if "bpb" in entry:
        return _interval(entry["bpb"], entry["lo"], entry["hi"], digits=3) + _dagger(entry)
    return _interval(entry["ppl"], entry["lo"], entry["hi"]) + _dagger(entry)


def tokenizer_note(result: dict) -> str | None:
    """The line that says when the results use different tokenizers, and what is compared then."""
    if result.get("unit") != "bpb":
        return None
    return (f"note: these results use different tokenizers ({', '.join(result['tokenizers'])}): perplexity per token is "
            "not comparable across them, so every figure is in bits per byte of the scored text (lower is better)")


def _plural(word: str, n: int) -> str:
    return word if n == 1 else word + "s"


def _by_length(title: str, lengths: list[str], inside: bool, caption: str | None = None) -> Table:
    """A table of methods x lengths, after an in-distribution column where there is one."""
    return Table(title, [Column("method", no_wrap=True)]
                 + [Column(L, "right") for L in (["in distribution"] if inside else []) + lengths], caption=caption)


def _inside_cells(inside: bool, entry: dict | None, text) -> list[str]:
    """The in-distribution cell of a row, where the table has that column: text(entry), or empty."""
    return [] if not inside else [""] if entry is None else [text(entry)]


def compare_report(result: dict) -> list[Table | str]:
    """The tables and notes (strings) of a compare_runs result, in print order (tables.show)."""
    lengths = [str(L) for L in result["lengths"]]
    pct = f"{100 * result['level']:g}%"
    bpb = result.get("unit") == "bpb"
    scale = ("bits per byte: the mean over windows of each window's scored NLL in bits over the bytes of its text"
             if bpb else "a perplexity's: its mean NLL's, exponentiated")
    where = (f"{result['windows']} windows from {result['documents']} documents; {pct} intervals over documents "
             f"({result['resamples']} bootstrap resamples, seed {result['seed']}) and seeds ({scale}); †: a method "
             "with one seed, so the interval covers documents only (or windows from one document: seeds only)")
    # the in-distribution point (each window's last T_train tokens read alone) where eval.json kept it
    inside = any("in_distribution" in m for m in result["methods"].values())
    if inside:
        where += ("; in distribution: the last T_train tokens of each window read with T_train tokens of input "
                  "(ΔP's first term), over the seeds whose eval.json keeps it (the ΔP table's)")
    what = "bits per byte" if bpb else "perplexity"
    ppl = _by_length(f"{what} of the last {result['scored']} tokens, mean over seeds [{pct} interval]", lengths,
                     inside, where)
    for method, m in result["methods"].items():
        ppl.add_row(f"{method} ({len(m['seeds'])} {_plural('seed', len(m['seeds']))})",
                    *_inside_cells(inside, m.get("in_distribution"), _ppl), *(_ppl(m["lengths"][L]) for L in lengths))
    items: list[Table | str] = [note for note in [tokenizer_note(result)] if note] + [ppl]

    with_dp = {method: m for method, m in result["methods"].items()
               if any("delta_p" in m["lengths"][L] for L in lengths)}
    if with_dp:  # at the lengths beyond a training length only
        dp_lengths = [L for L in lengths if any("delta_p" in m["lengths"][L] for m in with_dp.values())]
        dp = _by_length(f"ΔP{' in bits per byte' if bpb else ''}, mean over seeds [{pct} interval] (positive: context "
                        "beyond the training length helps)", dp_lengths, inside=False)
        for method, m in with_dp.items():
            entries = [m["lengths"][L].get("delta_p") for L in dp_lengths]
            seeds = m["delta_p_seeds"]
            known = [str(seed) for seed in seeds if seed is not None]  # an HF model has no training seed
            dp.add_row(f"{method} ({_plural('seed', len(known))} {', '.join(known)})" if known else method,
                       *("" if e is None else _interval(e["value"], e["lo"], e["hi"], "+", 3 if bpb else 2) + _dagger(e)
                         for e in entries))
        items.append(dp)
    items += effective_tables(result)
    items += _notes(result, lengths)

    if result["reference"] is not None and result["differences"]:
        items += _difference_tables(result, lengths, pct, inside, what)
    return items


def effective_cell(e: dict | None) -> str:
    """An effective length "L [lo, hi]" (≥ where it is the longest evaluated), or "-" where there is none."""
    if not e or "length" not in e:
        return "-"
    return f"{'≥' if e['reaches_longest'] else ''}{e['length']} [{e['lo']}, {e['hi']}]"


def effective_tables(result: dict) -> list[Table | str]:
    """Each method's effective length by perplexity, then by each suite file's tasks (suite_tables)."""
    from .suite_tables import suite_effective_tables

    rows = {method: m["effective_length"] for method, m in result["methods"].items() if "effective_length" in m}
    tables = []
    if rows:
        table = Table("effective length by perplexity: the longest length up to which ppl(L) <= ppl(T_train) / 0.85 "
                      "[range]",
                      [Column("method", no_wrap=True), Column("effective length", "right"), Column("reference")],
                      caption="≥: the longest evaluated length (it may hold further); range: the rule on each length's "
                              "95% interval bounds (pointwise); the JSON's effective_length_rule states the rule")
        for method, e in rows.items():
            table.add_row(method, effective_cell(e), e.get("reference") or e.get("note", ""))
        tables.append(table)
    return tables + suite_effective_tables(result)


def _notes(result: dict, lengths: list[str]) -> list[str]:
    """Windows worse than uniform guessing, and why ΔP is left out where it is."""
    notes = []
    above = {(method, L): m["lengths"][L] for method, m in result["methods"].items() for L in lengths
             if m["lengths"][L].get("above_uniform_windows")}
    if above:
        docs = sorted({d for e in above.values() for d in e["above_uniform_documents"]}, key=str)
        notes.append(f"warning: {len(above)} (method, length) cells have windows whose mean NLL is above "
                     f"ln(vocabulary) (worse than uniform guessing: text the model cannot read), from documents "
                     f"{', '.join(map(str, docs[:10]))}{', ...' if len(docs) > 10 else ''}; compare.json lists them "
                     "(above_uniform_windows); the verdict table shows whether one decides a difference")
    why: dict[str, list[str]] = {}  # why ΔP is left out -> the methods it applies to
    for method, m in result["methods"].items():
        if m["delta_p_note"]:
            why.setdefault(m["delta_p_note"], []).append(method)
    notes += [f"ΔP left out ({', '.join(methods)}): {note}" for note, methods in why.items()]
    curves = result.get("per_position") or {}
    if curves:  # the curves themselves are in the JSON and the figure
        without = [method for method, c in curves.items() if "nll" not in c]
        notes.append(f"per-position loss (mean NLL in {max(len(c.get('nll', [])) for c in curves.values())} "
                     "log-spaced position bins, with intervals): in the JSON's per_position and the _per_position.png "
                     "figure beside it" + (f"; none for {', '.join(without)}" if without else ""))
    return notes


def _difference_tables(result: dict, lengths: list[str], pct: str, inside: bool, what: str) -> list[Table]:
    """Each method minus the reference, and the verdicts that one document can change."""
    diff = _by_length(f"{what} minus {result['reference']}'s, mean over seeds [{pct} interval over seeds and "
                      "documents]", lengths, inside,
                      "bold: the interval excludes 0 (negative: better than the reference); †: a method with one "
                      "seed, so the interval covers documents only (not a claim about the method), or windows "
                      "from one document (seeds only)")

    def cell(d: dict) -> str:
        digits = 3 if what == "bits per byte" else 2
        text = _interval(d["diff"], d["lo"], d["hi"], "+", digits) + _dagger(d)
        return Strong(text) if d["excludes_zero"] else text

    decided = Table("verdicts that one document can change (dropping it alone changes the verdict)",
                    [Column("method", no_wrap=True), Column("length"), Column("verdict"), Column("documents")],
                    caption="the verdict with every document; the documents whose removal alone changes it "
                            "(compare.json: each one's difference and interval without it)")
    for method, rows in result["differences"].items():
        diff.add_row(method, *_inside_cells(inside, rows.get("in_distribution"), cell), *(cell(rows[L]) for L in lengths))
        for column, d in rows.items():
            flips = d.get("decided_by") or []
            if flips:
                ids = ", ".join(str(f["document"]) for f in flips[:5]) + (", ..." if len(flips) > 5 else "")
                decided.add_row(method, column, d["verdict"], f"{len(flips)}: {ids}")
    tables = [diff, _beside(result, lengths, inside)]
    return tables + [decided] if decided.rows else tables


def _beside(result: dict, lengths: list[str], inside: bool) -> Table:
    """Beside each difference: each method's seed-to-seed spread (of its per-seed values), the share of
    documents on which it beats the reference, and its median window NLL (beside exp(mean NLL): a few
    bad windows move the mean, not the median)."""
    reference = result["reference"]
    table = _by_length(f"beside the differences: each method's seed spread (sd of its seeds' values), the "
                       f"documents on which it is lower than {reference} (win rate), its median window NLL",
                       lengths, inside, "sd -: one seed; the median NLL pools every seed's windows")
    keys = (["in_distribution"] if inside else []) + lengths

    def cell(entry: dict | None, difference: dict | None) -> str:
        if entry is None:
            return ""
        seeds = entry.get("per_seed") or []
        parts = ["sd -" if len(seeds) < 2 else f"sd {statistics.stdev(seeds):.2f}"]
        if difference is not None and difference.get("document_win_rate") is not None:
            parts.append(f"wins {100 * difference['document_win_rate']:.0f}%")
        median = entry.get("median_nll", entry.get("median_bpb"))
        if median is not None:
            parts.append(f"med {median:.3f}")
        return " · ".join(parts)

    def row(method: str, differences: dict) -> list[str]:
        m = result["methods"][method]
        entries = {key: m.get("in_distribution") if key == "in_distribution" else m["lengths"][key] for key in keys}
        return [cell(entries[key], differences.get(key)) for key in keys]

    table.add_row(f"{reference} (reference)", *row(reference, {}))
    for method, differences in result["differences"].items():
        table.add_row(method, *row(method, differences))
    return table


def unfinished_runs(result: dict) -> list[str]:
    """A warning per run whose eval.json is of a model that had not finished training."""
    return [f"warning: {run['run']}/eval.json is of a model that had not finished training (step {run['step']})"
            for run in result["runs"] if run["finished"] is not True]
