"""`lenx list`'s tables: every method with its backends per device, the CHE tasks."""

import io

from rich.console import Console

from lenx.report.list_tables import method_backends, methods_table, tasks_table
from lenx.report.tables import show
from lenx.tasks import TASKS


def test_methods_and_their_backends():
    rows = {m["method"]: m for m in method_backends()}
    assert rows["kerple"]["backends"]["cpu"] == ["chunked", "dense", "flex (forward only)"]
    assert "training: skewed" in ", ".join(rows["dapev2-kerple"]["backends"]["cuda"])
    table = methods_table([rows["dape-kerple"]])
    buf = io.StringIO()
    show([table], Console(file=buf, width=400))
    # a description's brackets are text, not rich markup
    assert "MLP over [scores; bias] across heads" in buf.getvalue()
    assert "names read [processor-][normaliser-]base" in buf.getvalue()


def test_tasks_table():
    table = tasks_table(TASKS)
    assert [row[0] for row in table.rows] == list(TASKS)
    assert table.rows[0][1:] == [TASKS[table.rows[0][0]].level, f"{TASKS[table.rows[0][0]].chance:.3g}"]
    assert table.columns[0].no_wrap
