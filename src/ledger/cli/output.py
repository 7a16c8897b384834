"""Tables for people and for pipes.

On a terminal a table is drawn by rich at the terminal's width. Anywhere else
(a pipe, a file, a CI log) it is plain tab-separated values: a header line,
then one line per row, never cut at 80 columns or wrapped, so ``cut``,
``awk`` and ``sort`` work on it. ``LEDGER_TABLES=tsv`` or ``rich`` forces
either. ``--json`` remains the format for programs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ledger.settings import environment


def _plain() -> bool:
    forced = (environment("tables") or "").lower()
    if forced in ("tsv", "rich"):
        return forced == "tsv"
    return not sys.stdout.isatty()


def _cell(value: object) -> str:
    # a tab or newline inside a cell would break the row apart
    return " ".join(str(value).split("\t")).replace("\r", " ").replace("\n", " ")


class table:
    """Collect rows, then ``print()`` them as a rich table or as TSV."""

    def __init__(self, *headers: str, title: str | None = None):
        self.headers = headers
        self.title = title
        self.rows: list[tuple[Sequence[str], str]] = []

    def add_row(self, *cells: str, style: str = "") -> None:
        self.rows.append((cells, style))

    def print(self) -> None:
        """Print on stdout (TSV when stdout is not a terminal)."""
        if _plain():
            out = sys.stdout
            if self.title:
                out.write(f"# {self.title}\n")
            out.write("\t".join(self.headers) + "\n")
            for cells, _style in self.rows:
                out.write("\t".join(_cell(c) for c in cells) + "\n")
            out.flush()
            return
        from rich.table import Table
        from rich.text import Text

        from ledger.cli.context import console

        drawn = Table(*self.headers, title=self.title)
        for cells, style in self.rows:
            # cells are data (a check's error, a target), never markup: a
            # "[/x]" in one would otherwise stop the table with a MarkupError
            drawn.add_row(*(Text(str(c)) for c in cells), style=style or None)
        console.print(drawn)
