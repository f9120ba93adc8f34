"""The table `lenx eval --task ruler|babilong|...` prints: each suite task's exact match per length."""

from .tables import Column, Table


def suite_table(result: dict) -> Table:
    """Tasks x lengths: exact match averaged over depths (the per-depth grids are in the JSON)."""
    lengths = result["lengths"]
    table = Table(f"{result['task']} exact match of {result.get('label', result['method'])} (mean over depths "
                  f"{', '.join(f'{d:g}' for d in result['depths'])}; {result['samples']} inputs per cell)",
                  [Column("task"), Column("chance", "right")] + [Column(str(L), "right") for L in lengths])
    for name, r in result["tasks"].items():
        table.add_row(name, f"{r['chance']:.2g}", *(f"{sum(row) / len(row):.2f}" for row in r["exact"]))
    return table


def any_task_table(result: dict) -> Table:
    """The suite's table for a suite result, else the retrieval grid of passkey / copy."""
    from .eval_tables import task_table

    return suite_table(result) if "tasks" in result else task_table(result)


def split_suite(result: dict) -> list[dict]:
    """A suite result as one passkey-like result per task ("task": its name, "exact", "logprob"), for
    the per-task heatmaps of `lenx plot`."""
    common = {k: v for k, v in result.items() if k != "tasks"}
    return [common | r | {"task": name} for name, r in result["tasks"].items()]


def suite_effective_tables(result: dict) -> list[Table | str]:
    """`lenx compare`: per suite file, each method's effective length per task, by exact match and by
    the answer's log-probability (lenx.report.effective's rule)."""
    from .compare_tables import effective_cell

    tables = []
    for name, f in (result.get("suite") or {}).items():
        if "methods" not in f:
            tables.append(f"{name}: no effective length: {f['note']}")
            continue
        table = Table(f"{name}: effective length per task (exact match >= 0.85 x, answer log-probability >= ln 0.85 + "
                      "its value at the training length) [range]",
                      [Column("method", no_wrap=True), Column("task"), Column("exact match", "right"),
                       Column("log-probability", "right")],
                      caption=f"lengths {', '.join(map(str, f['lengths']))}; {f['samples']} instances per length and "
                              "depth; -: none (at chance at the training length, or not evaluated there: the JSON says)")
        starts = set()
        for method, tasks in f["methods"].items():
            for task, e in tasks.items():
                table.add_row(method, task, effective_cell(e.get("exact")), effective_cell(e.get("logprob")))
                if "from" in e:
                    starts.add(e["from"])
        tables.append(table)
        if starts:
            tables.append(f"{name}: measured from length {', '.join(map(str, sorted(starts)))} (the training length, "
                          "or the shortest evaluated above it)")
    return tables
