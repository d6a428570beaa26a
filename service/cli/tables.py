"""Tables that fit a narrow terminal (80 columns and up): text folds onto more lines, ids
stay whole on one line, and names, times and counts stay whole while the width allows.

Left to itself, rich shrinks the widest wrappable columns without regard to their minimum
widths, then squeezes every column, crops what it cannot fit and drops the last columns, so
the widths are chosen here and given to rich as they are: ids get their longest value, every
other column at least its longest header word (``paused`` and ``owner`` never break); then
the ``keep`` columns, in the order given, get their longest value while the total still fits;
what is left is shared among the folding columns in proportion to what they lack."""

from collections.abc import Collection, Sequence

from rich import box
from rich.cells import cell_len
from rich.table import Table

GAP = 3
"""Between two columns: a space of padding each side and the (blank) rule."""
EDGES = 2
"""The table's (blank) left and right edges."""
MIN_TEXT = 6


def _widths(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    ids: Collection[str],
    keep: Sequence[str],
) -> list[int]:
    words = [max(len(word) for word in header.split()) for header in headers]
    longest = [
        max([cell_len(row[index]) for row in rows] + [words[index]])
        for index in range(len(headers))
    ]
    chosen = [
        longest[index] if header in ids else min(longest[index], max(MIN_TEXT, words[index]))
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


def narrow_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    width: int,
    ids: Collection[str] = (),
    keep: Sequence[str] = (),
) -> Table:
    """Cells are rich markup (escape what the user gave); ``width`` is the console's. A kept
    column is as wide as its longest value, so only its header may fold."""
    widths = _widths(headers, rows, width, ids, keep)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for index, header in enumerate(headers):
        if header in ids:
            table.add_column(header, no_wrap=True, width=widths[index])
        else:
            table.add_column(header, overflow="fold", width=widths[index])
    for row in rows:
        table.add_row(*row)
    return table
