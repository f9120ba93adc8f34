"""The CHE results table (che.md), in the layout of the DAPE V2 paper's table 6."""

from .tables import Table, columns


def che_table(summary: dict, cfg) -> Table:
    """Tasks x methods of a CHE summary ({task: {method: {mean, std, max}}}; lenx.che.protocol.summarise):
    accuracy in %, max over seeds (mean ± std); `cfg` (a CHEConfig) names the tasks, methods and
    protocol. A task x method that no run covered (merged folders need not cover all) shows –."""
    from ..tasks import get_task

    spread = "max over seeds (mean ± sample std)" if len(cfg.seeds) > 1 else "one seed (no spread to show)"
    table = Table(f"CHE accuracy (%), test lengths {cfg.test_min_length}..{cfg.test_max_length}, {cfg.steps} steps, "
                  f"seeds {cfg.seeds}: {spread}.",
                  columns("level", "task", "chance", *cfg.methods))
    for task in cfg.tasks:
        t = get_task(task)
        cells = []
        for m in cfg.methods:
            s = summary.get(task, {}).get(m)
            if s is None:
                cells.append("–")
            elif s.get("seeds", 2) == 1:  # a std of one seed is no spread: just its accuracy
                cells.append(f"{100 * s['mean']:.1f}")
            else:
                cells.append(f"{100 * s['max']:.1f} ({100 * s['mean']:.1f} ± {100 * s['std']:.1f})")
        table.add_row(t.level, task, f"{100 * t.chance:.1f}", *cells)
    return table
