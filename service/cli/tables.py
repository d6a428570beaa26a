"""Every listing the command prints, in one place: for a terminal a table that wraps, for a
pipe every value whole, one row a line, so ``grep``, ``cut`` and ``awk`` find what they look for.

Without a terminal (stdout a pipe or a file) there is no width to fit: a table drawn for the 80
columns rich assumes would fold ``papers-digest`` into ``papers-d`` and ``igest`` on two lines.
So a listing is tab-separated there, with a header line, its values as they are (a tab or a
line break inside one becomes a space). ``--json`` gives every field, for a script that wants
more than the columns.

At a terminal, the tables fit a narrow one (80 columns and up): text folds onto more lines,
the ``whole`` columns (ids, names, statuses) stay on one line, and times and counts stay whole
while the width allows.

Left to itself, rich shrinks the widest wrappable columns without regard to their minimum
widths, then squeezes every column, crops what it cannot fit and drops the last columns, so
the widths are chosen here and given to rich as they are: whole columns get their longest
value, every other column at least its longest header word (``paused`` and ``owner`` never
break); then
the ``keep`` columns, in the order given, get their longest value while the total still fits;
what is left is shared among the folding columns in proportion to what they lack."""

import re
from collections.abc import Collection, Sequence

import typer
from rich import box
from rich.cells import cell_len
from rich.markup import escape
from rich.table import Table

from service.cli.app import console

GAP = 3
"""Between two columns: a space of padding each side and the (blank) rule."""
EDGES = 0
"""The table has no left and right edges: two more columns for its values."""
MIN_TEXT = 6
_SEPARATORS = re.compile(r"[\t\r\n]")


def _widths(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    whole: Collection[str],
    keep: Sequence[str],
) -> list[int]:
    words = [max(len(word) for word in header.split()) for header in headers]
    longest = [
        max([cell_len(row[index]) for row in rows] + [words[index]])
        for index in range(len(headers))
    ]
    chosen = [
        longest[index] if header in whole else min(longest[index], max(MIN_TEXT, words[index]))
        for index, header in enumerate(headers)
    ]
    free = width - EDGES - sum(chosen) - GAP * (len(headers) - 1)
    for header in keep:
        index = list(headers).index(header)
        if longest[index] - chosen[index] <= free:
            free -= longest[index] - chosen[index]
            chosen[index] = longest[index]
    lacking = {index: longest[index] - chosen[index] for index in range(len(headers))}
    wanted = sum(lacking.values())
    if free > 0 and wanted > 0:
        share = min(free, wanted)
        for index, lack in lacking.items():
            chosen[index] += lack * share // wanted
    return chosen


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    whole: Collection[str] = (),
    keep: Sequence[str] = (),
) -> None:
    """Cells are plain text, never markup. ``whole`` columns are never folded nor cut: where
    they do not fit the terminal side by side, each row is printed as a record, a line per
    column, as psql's expanded display does, rather than rich cropping an id."""
    if not console.is_terminal:
        typer.echo(_tab_separated(headers))
        for row in rows:
            typer.echo(_tab_separated(row))
        return
    widths = _widths(headers, rows, console.width, whole, keep)
    if sum(widths) + GAP * (len(headers) - 1) + EDGES > console.width:
        _print_records(headers, rows)
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for index, header in enumerate(headers):
        if header in whole:
            table.add_column(header, no_wrap=True, width=widths[index])
        else:
            table.add_column(header, overflow="fold", width=widths[index])
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    console.print(table)


def _print_records(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A row as its column names and values, one a line, a blank line between rows; a value
    wider than the terminal wraps onto the next line at its end."""
    pad = max(len(header) for header in headers)
    for index, row in enumerate(rows):
        if index:
            console.print()
        for header, cell in zip(headers, row, strict=True):
            console.print(f"{header:<{pad}}  {cell}", markup=False, highlight=False)


def _tab_separated(values: Sequence[str]) -> str:
    return "\t".join(_SEPARATORS.sub(" ", value) for value in values)
