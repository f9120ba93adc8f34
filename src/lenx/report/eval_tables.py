"""Tables of `lenx eval` and `lenx sweep`: perplexity per method and length, an HF model's
evaluation (`lenx eval --hf`), retrieval grids, and a sweep's results.md."""

import statistics

from .tables import Column, Table, columns, to_markdown


def eval_table(results: list[dict]) -> Table:
    """Methods x lengths of eval results, the training length's column marked: perplexity (ΔP).
    A row is named by the result's label where it has one (rope+yarn: a RoPE extension at
    evaluation), else its method. Results that share it (one per seed) make one row of mean ± sample
    standard deviation."""
    by_method: dict[str, list[dict]] = {}
    for r in results:
        by_method.setdefault(r.get("label") or r["method"], []).append(r)
    counts = {len(runs) for runs in by_method.values()}
    lengths = sorted({int(L) for r in results for L in r["results"]})
    train_lens = {r["train_len"] for r in results}
    title = f"perplexity of the last {results[0]['scored']} tokens (ΔP in brackets); {results[0]['window_note']}"
    if max(counts) > 1:
        title += f"; mean ± sample std over {max(counts)} seeds" if len(counts) == 1 else "; mean ± sample std over seeds"
    table = Table(title, columns("method", *(f"{L} (train)" if L in train_lens else str(L) for L in lengths),
                                 right_from=1))
    for method, runs in by_method.items():
        name = f"{method} ({len(runs)} seeds)" if len(counts) > 1 else method
        table.add_row(name, *(_cell([r["results"].get(str(L)) for r in runs]) for L in lengths))
    return table


def _cell(rows: list[dict | None]) -> str:
    """Perplexity (ΔP), or the mean ± std of each over the seeds that have this length."""
    rows = [row for row in rows if row is not None]
    if not rows:
        return ""

    def stat(values: list[float], sign: str = "") -> str:
        text = f"{statistics.mean(values):{sign}.2f}"
        return text + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")

    text = stat([row["ppl"] for row in rows])
    delta = [row["delta_p"] for row in rows if "delta_p" in row]
    return text + (f" ({stat(delta, '+')})" if delta else "")


def hf_table(result: dict) -> Table:
    """One evaluation of `lenx eval --hf`: per length (in the corpus's tokens) the model's tokens read,
    its perplexity per token (ΔP), and bits per byte, which compare across tokenizers."""
    tok = result.get("tokenizer") or {}
    same = tok.get("same_as_corpus")
    own = "" if same else " read as text in the model's own tokens"
    train_len = result["train_len"]
    caption = "perplexity per model token; bits per byte of the text the scored tokens cover"
    at_train = (result["results"].get(str(train_len)) or {}).get("input_tokens")
    if not same:  # the training length is the model's, in its tokens; lenx's lengths count the corpus's
        caption += (f"; the lengths and the training length {train_len} (ΔP's, the (train) row's) count corpus "
                    "tokens" + (f": at {train_len} the model reads {statistics.mean(at_train):.0f} of its own"
                                if at_train else ""))
    table = Table(f"{result['method']}: the last {result['scored']} corpus tokens of each window{own} "
                  f"(trained at {train_len}); {result['window_note']}",
                  columns("length" if same else "corpus tokens", "model tokens read", "perplexity (ΔP)",
                          "bits per byte", right_from=1), caption=caption)
    for L in result["lengths"]:
        row = result["results"][str(L)]
        read = row.get("input_tokens") or []
        table.add_row(f"{L} (train)" if L == train_len else str(L),
                      f"{statistics.mean(read):.0f}" if read else "", _cell([row]),
                      f"{row['bpb']:.3f}" if "bpb" in row else "")
    return table


def task_table(result: dict) -> Table:
    """A retrieval grid (`lenx eval --task`): lengths x depths of its main score."""
    key = "exact" if result["task"] == "passkey" else "accuracy"
    table = Table(f"{result['task']} {key} of {result.get('label', result['method'])} (trained at "
                  f"{result['train_len']}; {result['samples']} inputs per cell; chance {result['chance']:.2g})",
                  [Column("length")] + [Column(f"depth {d:g}", "right") for d in result["depths"]])
    for L, row in zip(result["lengths"], result[key]):
        table.add_row(str(L), *(f"{v:.2f}" for v in row))
    return table


def results_table(results: list[dict], key: str = "ppl") -> Table:
    """One figure (`key`: ppl or delta_p) of each result, methods x lengths, with no title."""
    lengths = sorted({int(L) for r in results for L in r["results"]})
    table = Table(None, columns("method", *map(str, lengths)))
    for r in results:
        table.add_row(r["method"], *(f"{r['results'][str(L)][key]:.2f}" if key in r["results"].get(str(L), {}) else ""
                                     for L in lengths))
    return table


def sweep_markdown(results: list[dict]) -> str:
    """A sweep's results.md: its perplexity and ΔP tables."""
    first = results[0]
    return "\n".join(["# Sweep results", "", f"Perplexity of the last {first['scored']} tokens, trained at "
                      f"{first['train_len']} on `{first['corpus']}`; {first['window_note']}.", "",
                      to_markdown(results_table(results, "ppl")),
                      "ΔP (positive: context beyond the training length helps):", "",
                      to_markdown(results_table(results, "delta_p"))])
