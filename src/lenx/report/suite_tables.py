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
