"""What `lenx compare` prints, from a made-up compare_runs result: the tables in order, intervals,
the bold differences, the verdicts one document decides, and the notes."""

from lenx.report.compare_tables import compare_report, unfinished_runs
from lenx.report.tables import Strong, Table


def entry(ppl, **more):
    return {"ppl": ppl, "lo": ppl - 1, "hi": ppl + 1, **more}


def comparison():
    dp = {"value": 0.5, "lo": -0.25, "hi": 1.25}
    return {
        "lengths": [64, 128], "level": 0.95, "windows": 8, "documents": 6, "resamples": 200, "seed": 0,
        "scored": 32, "reference": "kerple",
        "methods": {
            "kerple": {"seeds": [0], "lengths": {"64": entry(7.0), "128": entry(7.5)}, "delta_p_seeds": [],
                       "delta_p_note": "no ΔP terms"},
            "rope": {"seeds": [0, 1], "lengths": {"64": entry(8.0), "128": entry(9.0, delta_p=dp)},
                     "delta_p_seeds": [0, 1], "delta_p_note": None},
        },
        "differences": {"rope": {
            "64": {"diff": 1.0, "lo": 0.5, "hi": 1.5, "excludes_zero": True, "verdict": "worse",
                   "decided_by": [{"document": 3}]},
            "128": {"diff": 1.5, "lo": -0.5, "hi": 3.5, "excludes_zero": False, "verdict": "no difference",
                    "covers": "documents only"},
        }},
        "runs": [{"run": "r/rope-s0", "finished": True, "step": 4}, {"run": "r/rope-s1", "finished": False, "step": 2}],
    }


def test_tables_and_notes_in_order():
    result = comparison()
    result["differences"]["rope"]["64"]["document_win_rate"] = 0.5
    result["methods"]["rope"]["lengths"]["64"] |= {"median_nll": 2.0, "per_seed": [7.75, 8.25]}
    items = compare_report(result)
    assert [type(i) for i in items] == [Table, Table, str, Table, Table, Table]
    ppl, dp, note, diff, beside, decided = items
    assert ppl.caption.startswith("8 windows from 6 documents; 95% intervals over documents (200 bootstrap "
                                  "resamples, seed 0) and seeds (a perplexity's: its mean NLL's, exponentiated); "
                                  "†: a method with one seed")
    assert [c.name for c in ppl.columns] == ["method", "64", "128"]
    assert ppl.rows == [["kerple (1 seed)", "7.00 [6.00, 8.00]", "7.50 [6.50, 8.50]"],
                        ["rope (2 seeds)", "8.00 [7.00, 9.00]", "9.00 [8.00, 10.00]"]]
    assert [c.name for c in dp.columns] == ["method", "128"]
    assert dp.rows == [["rope (seeds 0, 1)", "+0.50 [-0.25, +1.25]"]]
    assert note == "ΔP left out (kerple): no ΔP terms"
    assert diff.rows == [["rope", "+1.00 [+0.50, +1.50]", "+1.50 [-0.50, +3.50]†"]]
    assert isinstance(diff.rows[0][1], Strong) and not isinstance(diff.rows[0][2], Strong)
    assert decided.rows == [["rope", "64", "worse", "1: 3"]]
    # beside each difference: the seeds' spread, the documents won, the median NLL (where known)
    assert beside.rows == [["kerple (reference)", "sd -", "sd -"], ["rope", "sd 0.35 · wins 50% · med 2.000", "sd -"]]


def test_without_reference_only_the_perplexity_table():
    result = comparison() | {"reference": None, "differences": {}}
    for m in result["methods"].values():
        m["delta_p_note"] = None
    assert [type(i) for i in compare_report(result)] == [Table, Table]


def test_in_distribution_column():
    result = comparison()
    result["methods"]["rope"]["in_distribution"] = entry(6.0)
    ppl = compare_report(result)[0]
    assert [c.name for c in ppl.columns] == ["method", "in distribution", "64", "128"]
    assert ppl.rows[0][1] == "" and ppl.rows[1][1] == "6.00 [5.00, 7.00]"
    assert "in distribution: the last T_train tokens" in ppl.caption


def test_unfinished_runs():
    assert unfinished_runs(comparison()) == [
        "warning: r/rope-s1/eval.json is of a model that had not finished training (step 2)"]


def test_bits_per_byte_say_why_in_one_line():
    result = comparison()
    for m in result["methods"].values():
        m["lengths"] = {L: {"bpb": e["ppl"] / 8, "lo": e["lo"] / 8, "hi": e["hi"] / 8} | (
            {"delta_p": e["delta_p"]} if "delta_p" in e else {}) for L, e in m["lengths"].items()}
    result |= {"unit": "bpb", "tokenizers": ["GPT2TokenizerFast 12345678", "corpus"]}
    items = compare_report(result)
    assert items[0] == ("note: these results use different tokenizers (GPT2TokenizerFast 12345678, corpus): "
                        "perplexity per token is not comparable across them, so every figure is in bits per byte of "
                        "the scored text (lower is better)")
    ppl, dp = items[1], items[2]
    assert ppl.title.startswith("bits per byte of the last 32 tokens")
    # the footnote says what a bits-per-byte interval is of, not a perplexity's
    assert "(bits per byte: the mean over windows of each window's scored NLL in bits over the bytes of its text)" \
        in ppl.caption and "exponentiated" not in ppl.caption
    assert ppl.rows[0] == ["kerple (1 seed)", "0.875 [0.750, 1.000]", "0.938 [0.812, 1.062]"]
    assert dp.title.startswith("ΔP in bits per byte") and dp.rows[0][-1] == "+0.500 [-0.250, +1.250]"
    assert "bits per byte minus kerple's" in items[4].title and items[4].rows[0][1] == Strong("+1.000 [+0.500, +1.500]")
    per_token = compare_report(comparison())[0]  # one tokenizer: no line, perplexity
    assert per_token.title.startswith("perplexity") and "(a perplexity's: its mean NLL's, exponentiated)" in per_token.caption
