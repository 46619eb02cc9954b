"""Render a `stepscope.analysis.per_rank.summary.Summary` in the terminal: the report's top-ops and top-kernels tables
(report/tables.py), per rank."""

from __future__ import annotations

from collections.abc import Iterator

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.text import Text

from stepscope.analysis.per_rank.summary import RankSummary, Summary
from stepscope.report.tables import kernel_table, op_table
from stepscope.report.terminal import fit_table, fmt_us, plain


class SummaryReport:
    """Per rank: the top CPU ops by self time, then the top GPU kernels by total time."""

    def __init__(self, summary: Summary, *, wide: bool = False) -> None:
        self.summary = summary
        self.wide = wide

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for i, rank in enumerate(self.summary.ranks):
            if i:
                yield Text("")
            yield from _rank(rank, self.wide)


def _rank(r: RankSummary, wide: bool) -> Iterator[RenderableType]:
    yield Text(f"rank {r.rank}  {plain(r.source)}", style="bold")
    yield Text(
        f"CPU ops self time {fmt_us(r.cpu_self_us)} · kernels {fmt_us(r.kernel_us)} · "
        f"memcpy {fmt_us(r.memcpy_us)} · memset {fmt_us(r.memset_us)}"
    )
    if r.ops:
        yield fit_table(
            op_table([r], top=len(r.ops), title=f"Top {len(r.ops)} CPU ops by self time"), wide=wide
        )
    else:
        yield Text("no CPU ops in this trace")
    if r.kernels:
        title = f"Top {len(r.kernels)} GPU kernels by total time"
        yield fit_table(kernel_table([r], top=len(r.kernels), title=title), wide=wide)
    else:
        yield Text("no GPU kernels in this trace")
