"""The table model and its renderers: rich on a terminal (styles), rich piped (the same box, no
escape codes), markdown; text is shown as written in each, never read as rich markup."""

import io

from rich.console import Console

from lenx.report.tables import Column, Strong, Table, columns, show, to_markdown


def sample() -> Table:
    table = Table("device | torch 2.x", columns("method", "backend", "ms", right_from=2),
                  caption="times are medians")
    table.add_row("dape", "[scores; bias]", "1.50")
    table.add_row("kerple", "a|b", Strong("0.75"))
    return table


def printed(items, terminal: bool) -> str:
    buf = io.StringIO()
    show(items, Console(file=buf, width=120, force_terminal=terminal, color_system="standard" if terminal else None))
    return buf.getvalue()


def test_markdown():
    assert to_markdown(sample()) == ("device; torch 2.x\n\n"
                                     "| method | backend | ms |\n"
                                     "|---|---|--:|\n"
                                     "| dape | [scores; bias] | 1.50 |\n"
                                     "| kerple | a\\|b | **0.75** |\n"
                                     "\n"
                                     "times are medians\n")


def test_markdown_without_title_or_caption():
    table = Table(None, [Column("a"), Column("b", "right")], [["1", "2"]])
    assert to_markdown(table) == "| a | b |\n|---|--:|\n| 1 | 2 |\n"


def test_piped_output_keeps_the_box_and_drops_styles():
    text = printed([sample(), "note: [scores; bias] stays"], terminal=False)
    assert "\x1b[" not in text
    lines = text.splitlines()
    assert lines[0].strip() == "device | torch 2.x" and lines[-1] == "note: [scores; bias] stays"
    row = next(line for line in lines if "dape" in line)
    assert [c.strip() for c in row.split("│")[1:-1]] == ["dape", "[scores; bias]", "1.50"]  # not read as markup
    assert "times are medians" in text and "0.75" in text and "a|b" in text


def test_terminal_output_is_styled():
    text = printed([sample()], terminal=True)
    assert "\x1b[1m0.75" in text  # the Strong cell in bold
    assert "[scores; bias]" in text


def test_numbers_are_right_justified():
    table = Table(None, columns("name", "value", right_from=1), [["a", "1"], ["bb", "100"]])
    rows = [line for line in printed([table], terminal=False).splitlines() if line.startswith("│")]
    assert rows == ["│ a    │     1 │", "│ bb   │   100 │"]


def test_a_wide_table_piped_is_never_cut():
    """`lenx compare > log`: no terminal, so no width; a table wider than rich's 80-column default
    keeps every cell whole instead of ending them in an ellipsis."""
    table = Table("wide", columns("method", *[f"length {n}" for n in range(12)], right_from=1))
    table.add_row("dapev2-kerple-with-a-long-name", *[f"{n * 1.2345:.4f} [{n:.2f}, {n + 1:.2f}]" for n in range(12)])
    buf = io.StringIO()
    show([table, "a note"], Console(file=buf, width=80, force_terminal=False))
    text = buf.getvalue()
    assert "…" not in text and "dapev2-kerple-with-a-long-name" in text and "13.5795 [11.00, 12.00]" in text
    assert max(len(line) for line in text.splitlines()) > 80


def test_a_terminal_keeps_its_width():
    table = Table(None, columns("method", *[f"length {n}" for n in range(12)], right_from=1))
    table.add_row("kerple", *["1.0000 [0.90, 1.10]"] * 12)
    buf = io.StringIO()
    show([table], Console(file=buf, width=80, force_terminal=True, color_system=None))
    assert max(len(line) for line in buf.getvalue().splitlines()) <= 80
