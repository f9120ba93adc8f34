"""che.md: the paper's table 6 layout, max over seeds (mean ± std), – where no run covered a cell."""

from types import SimpleNamespace

from lenx.report.che_tables import che_table
from lenx.report.tables import to_markdown


def protocol(tasks, methods):
    return SimpleNamespace(tasks=tasks, methods=methods, seeds=[0, 1], steps=10, test_min_length=41,
                           test_max_length=56)


def test_table_reports_max_mean_std():
    summary = {"parity_check": {"rope": {"mean": 0.6, "std": 0.1, "max": 0.7, "seeds": 2}}}
    md = to_markdown(che_table(summary, protocol(["parity_check"], ["rope"])))
    assert md.startswith("CHE accuracy (%), test lengths 41..56, 10 steps, seeds [0, 1]: max over seeds "
                         "(mean ± sample std).\n\n| level | task | chance | rope |\n|---|---|---|---|\n")
    assert "| R | parity_check | 50.0 | 70.0 (60.0 ± 10.0) |" in md


def test_table_marks_missing_cells():
    summary = {"parity_check": {"rope": {"mean": 0.6, "std": 0.1, "max": 0.7, "seeds": 2}}}
    md = to_markdown(che_table(summary, protocol(["parity_check", "even_pairs"], ["rope", "alibi"])))
    assert "| parity_check | 50.0 | 70.0 (60.0 ± 10.0) | – |" in md
    assert "| even_pairs | 50.0 | – | – |" in md
