"""Render a `stepscope.analysis.rank.summary.Summary` as rich tables (formatting only)."""

from __future__ import annotations

from collections.abc import Iterator

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.text import Text

from stepscope.analysis.rank.summary import RankSummary, Summary
from stepscope.report.terminal import fmt_pct, fmt_us, make_table, plain


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
        yield make_table(
            f"Top {len(r.ops)} CPU ops by self time",
            ["Op", "Calls", "Self", "Self %", "Self mean", "Total (incl.)"],
            (
                [
                    o.name,
                    o.count,
                    fmt_us(o.self_us),
                    fmt_pct(o.self_pct),
                    fmt_us(o.mean_self_us),
                    fmt_us(o.total_us),
                ]
                for o in r.ops
            ),
            wide=wide,
        )
    else:
        yield Text("no CPU ops in this trace")
    if r.kernels:
        yield make_table(
            f"Top {len(r.kernels)} GPU kernels by total time",
            ["Kernel", "Count", "Total", "Mean", "% kernel time"],
            (
                [
                    k.name,
                    k.count,
                    fmt_us(k.total_us),
                    fmt_us(k.mean_us),
                    fmt_pct(k.pct),
                ]
                for k in r.kernels
            ),
            wide=wide,
        )
    else:
        yield Text("no GPU kernels in this trace")
