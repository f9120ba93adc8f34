"""The one table model, and its renderers: rich for people, GitHub markdown for files.

A table holds plain text. The rich renderer escapes what rich would read as markup (a method's
description says "[scores; bias]"), so a cell reads the same in every rendering. Printed through
rich, a table keeps its box when the output is piped; rich leaves out colours and styles then, and
the table is never cut to fit an assumed width.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Column:
    name: str
    justify: str = "left"  # "right" for numbers: also `--:` in markdown
    no_wrap: bool = False  # a name that is typed back (a method, a task) is never cut


class Strong(str):
    """A cell to stand out: bold in rich, **strong** in markdown."""


@dataclass
class Table:
    title: str | None
    columns: list[Column]
    rows: list[list[str]] = field(default_factory=list)
    caption: str | None = None
    piped_width: int | None = None  # printed to a pipe: wrap cells to about this width (no word is cut)

    def add_row(self, *cells: str) -> None:
        self.rows.append(list(cells))


def columns(*names: str, right_from: int | None = None) -> list[Column]:
    """Columns of these names; with right_from, the ones from that index on right-justified (numbers)."""
    return [Column(name, "right" if right_from is not None and i >= right_from else "left")
            for i, name in enumerate(names)]


def to_rich(table: Table):
    """A rich.table.Table of `table`."""
    from rich.markup import escape
    from rich.table import Table as RichTable

    def text(cell: str | None) -> str | None:
        if cell is None:
            return None
        return f"[bold]{escape(cell)}[/bold]" if isinstance(cell, Strong) else escape(cell)

    out = RichTable(title=text(table.title), caption=text(table.caption))
    for col in table.columns:
        out.add_column(text(col.name), justify=col.justify, no_wrap=col.no_wrap)
    for row in table.rows:
        out.add_row(*(text(cell) for cell in row))
    return out


def to_markdown(table: Table) -> str:
    """GitHub markdown: the title, the table and the caption, each a paragraph; ends with a newline."""
    lines = []
    if table.title:  # a title line with " | " in it could read as a table row
        lines += [table.title.replace(" | ", "; "), ""]
    lines.append("| " + " | ".join(_markdown_cell(c.name) for c in table.columns) + " |")
    lines.append("|" + "".join("--:|" if c.justify == "right" else "---|" for c in table.columns))
    lines += ["| " + " | ".join(_markdown_cell(cell) for cell in row) + " |" for row in table.rows]
    if table.caption:
        lines += ["", table.caption]
    return "\n".join(lines) + "\n"


def _markdown_cell(cell: str) -> str:
    text = cell.replace("|", "\\|")
    return f"**{text}**" if isinstance(cell, Strong) else text


def show(items, console=None) -> None:
    """Print tables and notes (plain strings) in order, to `console` (default: stdout)."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    for item in items:
        if isinstance(item, Table):
            rendered = to_rich(item)
            # A log or a pipe has no width: rich assumes 80 columns and would cut a wide table's
            # cells ("dapev…"); there the table gets its natural width instead.
            if console.is_terminal:
                console.print(rendered)
                continue
            measured = console.measure(rendered, options=console.options.update_width(1 << 16))
            natural = measured.maximum
            if item.piped_width:
                natural = min(natural, max(item.piped_width, measured.minimum))
            width, console.width = console.width, max(console.width, natural)
            console.print(rendered)
            console.width = width
        else:
            console.print(escape(item), highlight=False)
